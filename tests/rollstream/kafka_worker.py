"""A consumer process for the group-split test: appends each processed group_id to a file,
then marks it done and commits after every batch. SIGTERM stops it cleanly."""

from __future__ import annotations

import asyncio
import sys

import msgspec

from rollstream.config import InfraConfig
from rollstream.kafka import EventConsumer, EventProducer
from rollstream.lifecycle import stop_event


async def main(infra_json: str, out_path: str, name: str) -> None:
    infra = msgspec.json.decode(infra_json, type=InfraConfig)
    stop = stop_event()
    async with EventProducer(infra, client_id=name) as producer:
        async with EventConsumer(infra, "prompts", group_id="split", producer=producer, stage=name,
                                 max_poll_records=25) as consumer:
            with open(out_path, "a") as out:
                while not stop.is_set():
                    deliveries = await consumer.getmany(max_records=25, timeout_s=0.3)
                    for delivery in deliveries:
                        out.write(delivery.event.group_id + "\n")
                        out.flush()
                        consumer.done(delivery)
                    await consumer.commit()
                    await asyncio.sleep(0.05)  # slow enough for the test to kill it mid-stream


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
