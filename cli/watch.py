"""Watching a run: a status line per learner step, ``metrics.jsonl``, a summary, a plot.

The learner appends one record per step to ``steps.jsonl`` in its checkpoint directory (loss,
reward mean and pass rate over every group resolved since the step before, staleness, ...).
:class:`Watcher` turns each new record into a line of the run's ``metrics.jsonl`` (adding wall
time, completions per second, what waits on each topic, an ETA) and prints it as a status line;
:func:`summary` is the table printed at the end and :func:`plot` draws reward and pass rate per
step (with a moving average) for one run or several (``rollstream plot RUN [RUN ...]``).

What waits on each topic comes from the stages' own Prometheus metrics (records produced minus
records consumed, summed over the processes of each stage), scraped on loopback.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rollstream.evaluator.report import EVALS_FILE
from rollstream.schemas.stages import hops

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "reward.png"
# topic -> (stage that produces it, stage that consumes it), from the stage table
HOPS = hops()


def scrape(ports: Iterable[int], timeout_s: float = 1.0) -> dict[tuple[str, str, str], float]:
    """(direction "in"/"out", stage, topic) -> records, summed over the processes serving ``ports``."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[tuple[str, str, str], float] = {}
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as response:
                text = response.read().decode()
        except OSError:
            continue  # not serving yet (loading a model) or gone: its records are not counted
        for family in text_string_to_metric_families(text):
            direction = {"rollstream_records_in": "in", "rollstream_records_out": "out"}.get(family.name)
            if direction is None:
                continue
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    k = (direction, sample.labels.get("stage", ""), sample.labels.get("topic", ""))
                    totals[k] = totals.get(k, 0.0) + sample.value
    return totals


def waiting(totals: Mapping[tuple[str, str, str], float]) -> dict[str, int]:
    """Records on each topic produced and not yet consumed."""
    return {topic: max(0, int(totals.get(("out", src, topic), 0) - totals.get(("in", dst, topic), 0)))
            for topic, (src, dst) in HOPS.items()}


class Watcher:
    """Follows the learner's step log and writes the run's metrics.jsonl."""

    def __init__(self, steps_log: Path, run_dir: Path, max_steps: int, ports: Sequence[int] = (),
                 echo: Any = print, max_seconds: float = 0.0) -> None:
        self.steps_log, self.out = steps_log, run_dir / METRICS_FILE
        self.evals_log = steps_log.parent / EVALS_FILE  # the evaluator's reports (evaluator/stage.py)
        self.evals_read = 0
        self.evals: list[dict[str, Any]] = []
        self.max_steps, self.ports, self.echo = max_steps, list(ports), echo
        self.started = time.time()
        self.max_seconds = max_seconds  # a time limit (0: none) caps the ETA
        self.read = 0  # lines of the step log already turned into records
        self.records: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        """New records since the last poll (each written and printed); the evaluator's too."""
        self.poll_evals()
        steps, self.read = read_new(self.steps_log, self.read)
        new = [self.record(step) for step in steps]
        for record in new:
            self.emit(record, status_line(record, self.max_steps))
        return new

    def poll_evals(self) -> list[dict[str, Any]]:
        """The evaluator's new reports, as ``kind: eval`` lines of metrics.jsonl (and printed)."""
        reports, self.evals_read = read_new(self.evals_log, self.evals_read)
        new = [eval_record(report, self.started) for report in reports]
        for record in new:
            self.evals.append(record)
            self.emit(record, eval_line(record))
        return new

    def emit(self, record: Mapping[str, Any], line: str) -> None:
        """A record into metrics.jsonl, and its line on the console."""
        with open(self.out, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        self.echo(line)

    def record(self, step: Mapping[str, Any]) -> dict[str, Any]:
        previous = self.records[-1] if self.records else None
        now = float(step.get("time", time.time()))
        since = now - (previous["time"] if previous else self.started)
        record = {key: step.get(key) for key in (
            "step", "policy_version", "trained", "loss", "grad_norm", "tokens", "rollouts", "stale", "lag_mean",
            "lag_max", "groups_resolved", "groups_filtered", "completions", "reward_mean", "pass_rate",
            "family_reward", "kl", "entropy", "is_mean", "clip_frac_low", "clip_frac_high")}
        record.update(time=now, elapsed_s=round(now - self.started, 1), step_s=round(since, 1),
                      completions_per_s=round((step.get("completions") or 0) / since, 3) if since > 0 else None,
                      waiting=waiting(scrape(self.ports)) if self.ports else None)
        done = sum(1 for r in self.records if r["trained"]) + bool(step.get("trained"))
        mean_step = (now - self.started) / max(done, 1)
        eta = mean_step * (self.max_steps - done) if self.max_steps else None
        if self.max_seconds > 0:
            left = max(0.0, self.started + self.max_seconds - now)
            eta = left if eta is None else min(eta, left)
        record["eta_s"] = round(eta) if eta is not None else None
        self.records.append(record)
        return record


def read_new(path: Path, start: int) -> tuple[list[dict[str, Any]], int]:
    """The JSON lines of ``path`` after its first ``start`` lines (blank ones skipped; a line still
    being written waits for the next read), and how many lines are read now."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return [], start
    rows, read = [], start
    for line in lines[start:]:
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError:
                break
        read += 1
    return rows, read


def eval_record(report: Mapping[str, Any], started: float) -> dict[str, Any]:
    """A metrics.jsonl line of one EvalReported: held-out pass@1 per family against the version."""
    families = report.get("families") or []
    return {"kind": "eval", "version": report.get("version"), "step": report.get("step"),
            "scope": report.get("scope"), "status": report.get("status"), "reason": report.get("reason", ""),
            "samples": report.get("samples"), "time": report.get("reported_at"),
            "elapsed_s": round(float(report.get("reported_at") or started) - started, 1),
            "heldout_pass1": {f["family"]: f.get("pass_at", {}).get("1") for f in families},
            "heldout_pass1_with_code": {f["family"]: f.get("pass1_with_code") for f in families},
            "forgetting": sorted(f["family"] for f in families if f.get("forgetting"))}


def eval_line(record: Mapping[str, Any]) -> str:
    if record["status"] != "evaluated":
        return f"evaluator: version {record['version']} skipped ({record['reason'][:120]})"
    overall = record["heldout_pass1"].get("ALL")
    coded = record["heldout_pass1_with_code"].get("ALL")
    text = (f"evaluator: version {record['version']} ({record['scope']}, {record['samples']} samples): held-out "
            f"pass@1 {'-' if overall is None else f'{overall:.3f}'}"
            f" (among samples with code {'-' if coded is None else f'{coded:.3f}'})")
    if record["forgetting"]:
        text += " | FORGETTING: " + ", ".join(record["forgetting"])
    return text


def status_line(record: Mapping[str, Any], max_steps: int) -> str:
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.0f}%"

    def num(value: float | None, fmt: str = ".3f") -> str:
        return "-" if value is None else format(value, fmt)

    parts = [f"step {record['step']}/{max_steps or '-'} v{record['policy_version']}",
             f"{record['step_s']:.0f} s/step", f"{num(record['completions_per_s'], '.2f')} completions/s",
             f"reward {num(record['reward_mean'])}", f"pass {pct(record['pass_rate'])}",
             f"staleness {num(record['lag_mean'], '.1f')} (max {record['lag_max']}, dropped {record['stale'] or 0})"]
    if record.get("groups_filtered"):
        parts.append(f"filtered {record['groups_filtered']}")
    if record.get("waiting"):
        parts.append("waiting " + " ".join(f"{t} {n}" for t, n in record["waiting"].items()))
    if record.get("eta_s") is not None:
        parts.append(f"ETA {record['eta_s'] // 60:.0f} min {record['eta_s'] % 60:02.0f} s")
    if not record.get("trained"):
        parts.insert(1, "NOT TRAINED (every rollout stale)")
    return " | ".join(parts)


def read_records(run: Path, kind: str = "step") -> list[dict[str, Any]]:
    """The learner-step lines of a run's metrics.jsonl (``kind="eval"``: the evaluator's)."""
    path = run / METRICS_FILE if run.is_dir() else run
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("kind", "step") == kind]


def summary(records: Sequence[Mapping[str, Any]], evals: Sequence[Mapping[str, Any]] = ()) -> str:
    """The table printed when a run ends (with the evaluator's first and last held-out pass@1)."""
    if not records:
        return "no learner step was recorded"
    trained = [r for r in records if r["trained"]]

    def mean(key: str, rows: Sequence[Mapping[str, Any]]) -> str:
        values = [r[key] for r in rows if r.get(key) is not None]
        return f"{sum(values) / len(values):.3f}" if values else "-"

    first, last = records[: max(1, len(records) // 4)], records[-max(1, len(records) // 4):]
    rows = [
        ("steps trained", f"{len(trained)} of {len(records)}"),
        ("wall time", f"{records[-1]['elapsed_s']:.0f} s ({records[-1]['elapsed_s'] / max(len(records), 1):.1f} s/step)"),
        ("completions", f"{sum(r.get('completions') or 0 for r in records)} "
                        f"({mean('completions_per_s', records)} per s)"),
        ("reward mean, first / last quarter", f"{mean('reward_mean', first)} / {mean('reward_mean', last)}"),
        ("pass rate, first / last quarter", f"{mean('pass_rate', first)} / {mean('pass_rate', last)}"),
        ("rollouts dropped as stale", str(sum(r.get("stale") or 0 for r in records))),
        ("groups filtered (nothing to train on)", str(sum(r.get("groups_filtered") or 0 for r in records))),
        ("loss, first / last", f"{mean('loss', trained[:1])} / {mean('loss', trained[-1:])}"),
    ]
    done = [e for e in evals if e.get("status") == "evaluated" and e["heldout_pass1"].get("ALL") is not None]
    for e in (done[:1] + done[-1:]) if len(done) > 1 else done:
        rows.append((f"held-out pass@1 at version {e['version']} ({e['scope']})", f"{e['heldout_pass1']['ALL']:.3f}"))
    skipped = [e for e in evals if e.get("status") == "skipped"]
    if skipped:
        rows.append(("versions the evaluator skipped", ", ".join(str(e["version"]) for e in skipped)))
    from rollstream.cli.tables import table

    return "\n".join(f"  {line}" for line in table(["", ""], rows, header=False).splitlines())


def moving_average(values: Sequence[float | None], window: int) -> list[float | None]:
    out: list[float | None] = []
    for i in range(len(values)):
        seen = [v for v in values[max(0, i - window + 1): i + 1] if v is not None]
        out.append(sum(seen) / len(seen) if seen else None)
    return out


def plot(runs: Sequence[Path], out: Path, window: int = 5) -> Path:
    """Reward mean and pass rate per learner step of each run (thin: per step; thick: moving
    average over ``window`` steps), one figure, two panels. Returns ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    for i, run in enumerate(runs):
        records = read_records(run)
        steps = [r["step"] for r in records]
        color = f"C{i}"
        label = run.name if run.is_dir() else run.parent.name
        for axis, key in ((top, "reward_mean"), (bottom, "pass_rate")):
            values = [r.get(key) for r in records]
            axis.plot(steps, [v if v is not None else float("nan") for v in values], color=color, alpha=0.3,
                      linewidth=1)
            smooth = moving_average(values, window)
            axis.plot(steps, [v if v is not None else float("nan") for v in smooth], color=color, linewidth=2,
                      label=f"{label} ({window}-step average)")
        evals = [e for e in read_records(run, "eval") if e.get("status") == "evaluated"
                 and e["heldout_pass1"].get("ALL") is not None and e.get("step") is not None]
        for scope, style in (("live", dict(marker="o", linestyle="--")), ("final", dict(marker="*", markersize=12,
                                                                                       linestyle="none"))):
            chosen = [e for e in evals if e.get("scope") == scope]  # two task sets: never one line
            if chosen:
                bottom.plot([e["step"] for e in chosen], [e["heldout_pass1"]["ALL"] for e in chosen], color=color,
                            label=f"{label}: held-out pass@1, {scope} (evaluator)", **style)
    top.set_ylabel("reward, mean")
    bottom.set_ylabel("pass rate")
    bottom.legend(loc="best", fontsize=8)
    bottom.set_xlabel("learner step")
    top.legend(loc="best", fontsize=8)
    top.grid(alpha=0.3)
    bottom.grid(alpha=0.3)
    figure.suptitle("rollstream: every group resolved since the step before (trained, stale, filtered)")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out
