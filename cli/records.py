"""``rollstream inspect`` and ``rollstream runs``: what a run's archive says about one group, and
the runs under the state directory (:func:`run_paths`, :func:`archive_of`: where a run's archive is).

``inspect GROUP_ID`` (or a rollout id, ``GROUP_ID/INDEX``) gathers from the archive the group's
prompt, each completion (text and token count), its execution record, reward and components, its
advantage, the policy versions and staleness, what the learner did with the group (the step that
trained it, or why it was dropped) and any dead letters keyed by it. Without ``--run`` the runs
are searched newest first.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, get_args

import msgspec

from rollstream.config import Config
from rollstream.consumers.executor.score import failed_test_lines
from rollstream.errors import ConfigError

TAIL = 400  # characters of stdout/stderr shown per completion in the terminal


def register(name: str, p: argparse.ArgumentParser) -> Any:
    if name == "runs":
        p.add_argument("--json", action="store_true", help="print JSON for tools")
        return lambda args, config: runs_main(config, args.json)
    add_inspect_arguments(p)
    return lambda args, config: inspect_main(config, args)


def add_inspect_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="GROUP_ID", help="a group id, or a rollout id (GROUP_ID/INDEX)")
    p.add_argument("--run", help="the run (id under infra.state_dir/runs or directory; default: newest first)")
    p.add_argument("--archive", help="an archive root (directory or fsspec URL) instead of a run's")
    p.add_argument("--json", action="store_true", help="print JSON for tools")


def run_dirs(config: Config) -> list[Path]:
    """Run directories under the state directory, newest first."""
    root = Path(config.infra.state_dir) / "runs"
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name, reverse=True)


def run_paths(config: Config, run: str) -> tuple[Path, dict[str, Any]]:
    """The run directory of ``run`` (an id under state_dir/runs or a path) and its run.json."""
    path = Path(run)
    if not (path / "run.json").is_file() and not (path / "archive").exists():
        path = Path(config.infra.state_dir) / "runs" / run
    if not path.is_dir():
        raise ConfigError(f"no run {run!r}: neither a run directory nor a run id under {config.infra.state_dir}/runs "
                          "(`rollstream runs` lists them)")
    info = {}
    if (path / "run.json").is_file():
        info = json.loads((path / "run.json").read_text())
    return path, info


def archive_of(config: Config, run: str | None, archive: str | None) -> str:
    if archive:
        return archive
    if run is None:
        from rollstream.archive import archive_url

        return archive_url(config)
    path, info = run_paths(config, run)
    return info.get("archive") or str(path / "archive")


def gather(store: Any, group_id: str, rollout_id: str | None) -> dict[str, Any] | None:
    """Everything the archive holds about ``group_id`` (None: nothing)."""
    def events(name: str) -> list[tuple[dict[str, Any], Any]]:
        return list(store.events(name, partitions=store.group_partitions(name, group_id),
                                 filters=[("group_id", "=", group_id)]))

    prompts, actions, rewards = events("prompts"), events("actions"), events("rewards")
    advantaged, fates = events("advantages"), events("fates")
    if not (prompts or actions or rewards or advantaged or fates):
        return None
    originals = [p for _, p in prompts if p.continuation is None]
    prompt = originals[0] if originals else None
    # multi-turn: each continuation's observation, by (sample, the turn it leads to)
    observed = {(p.continuation.sample_index, p.continuation.turn): p.continuation.observation
                for _, p in prompts if p.continuation is not None}
    turns_of: dict[str, dict[int, Any]] = {}
    for _, action in actions:
        turns_of.setdefault(action.rollout.rollout_id, {}).setdefault(action.turn, action)
    advantage_of = {}
    group_event = advantaged[0][1] if advantaged else None
    if group_event is not None:
        advantage_of = {item.rollout.rollout_id: item for item in group_event.rollouts}
    reward_of: dict[str, Any] = {}
    for _, reward in rewards:
        reward_of.setdefault(reward.rollout.rollout_id, reward)
    fate_list = [msgspec.to_builtins(f) for _, f in fates]
    learner_version = fates[0][1].learner_version if fates else None
    samples: dict[str, dict[str, Any]] = {}
    for row, action in actions:
        if action.rollout.rollout_id in samples or (rollout_id and action.rollout.rollout_id != rollout_id):
            continue
        turns = turns_of[action.rollout.rollout_id]
        action = turns[max(turns)]  # the episode's last turn: its rollout spans them all
        r = action.rollout
        reward = reward_of.get(r.rollout_id)
        adv = advantage_of.get(r.rollout_id)
        samples[r.rollout_id] = {
            "rollout_id": r.rollout_id, "sample_index": r.sample_index, "completion": action.completion_text,
            "completion_tokens": len(r.completion_token_ids), "prompt_tokens": len(r.prompt_token_ids),
            "finish_reason": r.finish_reason, "generation_error": action.error,
            "policy_version_first": r.policy_version_first, "policy_version_last": r.policy_version_last,
            "staleness": None if learner_version is None else learner_version - r.policy_version_first,
            "generator_id": action.generator_id, "generate_s": action.generate_s,
            "reward": None if reward is None else reward.reward,
            "outcome": None if reward is None else reward.outcome,
            "components": None if reward is None else reward.components,
            "execution": None if reward is None else {**msgspec.to_builtins(reward.execution),
                                                      "verdict": reward.execution.verdict},
            "advantage": None if adv is None else adv.advantage,
            "actions_offset": [row["partition"], row["offset"]],
            "turns": [{"turn": t, "subtask_index": a.subtask_index, "completion": a.completion_text,
                       "observation_after": observed.get((r.sample_index, t + 1))} for t, a in sorted(turns.items())],
        }
    topics = {f.topic for f in store.files()}
    if samples and "audit" in topics:  # the connections each execution made through the egress proxy
        for _, audit in store.events("audit", filters=[("rollout_id", "in", list(samples))]):
            if audit.rollout_id in samples and audit.connections:
                samples[audit.rollout_id].setdefault("connections", []).extend(
                    msgspec.to_builtins(c) for c in audit.connections)
    dead = []
    for name in sorted(topics):
        if name.endswith(".dlq"):
            table = store.read(name, filters=[("key", "=", group_id.encode())])
            dead += [{"topic": name, "offset": r["offset"], "reason": r["verdict"]} for r in table.to_pylist()]
    return {
        "group_id": group_id, "archive": store.root,
        "task_id": prompt.task_id if prompt else (fates[0][1].task_id if fates else None),
        "family": prompt.family if prompt else (fates[0][1].family if fates else None),
        "prompt": None if prompt is None else [msgspec.to_builtins(m) for m in prompt.messages],
        "reward_spec": None if prompt is None else msgspec.to_builtins(prompt.reward),
        "group_size": prompt.group_size if prompt else None,
        "issued_policy_version": prompt.issued_policy_version if prompt else None,
        "samples": sorted(samples.values(), key=lambda s: s["sample_index"]),
        "group": None if group_event is None else {
            "estimator": group_event.estimator, "complete": group_event.complete, "filtered": group_event.filtered,
            "stats": msgspec.to_builtins(group_event.stats),
            "excluded": [msgspec.to_builtins(x) for x in group_event.excluded]},
        "fates": fate_list,
        "dead_letters": dead,
    }


def render(found: dict[str, Any]) -> str:
    lines = [f"group {found['group_id']}  task {found['task_id']}  family {found['family']}  (archive "
             + f"{found['archive']})"]
    if found["prompt"] is not None:
        spec = found["reward_spec"]
        lines.append(f"issued at policy version {found['issued_policy_version']}, {found['group_size']} samples, "
                     f"{len(spec['tests'])} tests, timeout {spec['timeout_s']} s")
        for message in found["prompt"]:
            lines.append(f"--- {message['role']} ---")
            lines.append(message["content"].rstrip())
    else:
        lines.append("(its prompt is not in the archive)")
    for fate in found["fates"] or [None]:
        if fate is None:
            lines.append("fate: not recorded (the learner has not consumed it, or the archive ends before)")
        elif fate["fate"] == "trained":
            lines.append(f"fate: trained in learner step {fate['step']} -> policy version {fate['policy_version']} "
                         f"({fate['rollouts_trained']} of {fate['rollouts']} rollouts; learner run {fate['learner_run']})"
                         + (f"; {fate['reason']}" if fate["reason"] else ""))
        else:
            lines.append(f"fate: {_outcome_name(fate['fate']).replace(':', ' as ')} at learner version "
                         f"{fate['learner_version']}: {fate['reason']} (learner run {fate['learner_run']})")
    if found["group"] is not None:
        g = found["group"]
        lines.append(f"group: {g['estimator']}, mean reward {g['stats']['reward_mean']:+.3f}, "
                     f"std {g['stats']['reward_std']:.3f}" + (f", filtered: {g['filtered']}" if g["filtered"] else "")
                     + ("" if g["complete"] else ", INCOMPLETE at its deadline"))
        for x in g.get("excluded") or []:
            lines.append(f"left out of the advantages: {x['rollout_id']} (outcome {x['outcome']}: no reward): "
                         f"{x['reason'][:300]}")
    for s in found["samples"]:
        e = s["execution"] or {}
        lines.append("")
        lines.append(f"=== {s['rollout_id']}: reward {_num(s['reward'])}, advantage {_num(s['advantage'])}, "
                     f"outcome {s.get('outcome') or '-'}, verdict {e.get('verdict', '-')} ({e.get('tests_passed', 0)}/{e.get('tests_total', 0)} tests), "
                     f"{s['completion_tokens']} tokens ({s['finish_reason']}), policy v{s['policy_version_first']}"
                     + (f"..v{s['policy_version_last']}" if s["policy_version_last"] != s["policy_version_first"] else "")
                     + ("" if s["staleness"] is None else f", staleness {s['staleness']}"))
        if s["components"]:
            lines.append("components: " + ", ".join(f"{k} {v:+.3f}" for k, v in s["components"].items()))
        lines += failed_test_lines(e, shown=8)
        if s["generation_error"]:
            lines.append(f"generation error: {s['generation_error']}")
        if len(s["turns"]) > 1:  # a multi-turn episode: each turn and what the sandbox said after it
            for t in s["turns"]:
                lines.append(f"--- turn {t['turn']}" + (f" (step {t['subtask_index'] + 1})" if t["subtask_index"] else "")
                             + " ---")
                lines.append(t["completion"].rstrip() or "(empty completion)")
                if t["observation_after"]:
                    lines.append("--- observation ---")
                    lines.append(t["observation_after"].rstrip())
            lines.append(f"--- verdict of turn {s['turns'][-1]['turn']} ---")
        else:
            lines.append(s["completion"].rstrip() or "(empty completion)")
        if e.get("error_message"):
            lines.append(f"error: {e['error_message']}" + (f" (line {e['error_line']})" if e.get("error_line") else ""))
        for stream in ("stdout_tail", "stderr_tail"):
            if e.get(stream):
                lines.append(f"{stream.split('_')[0]}: {e[stream][-TAIL:].rstrip()}")
        connections = s.get("connections") or []
        if connections:
            allowed = [c for c in connections if c["verdict"] == "allowed"]
            lines.append(f"egress: {len(allowed)} connection(s) allowed"
                         + (f" ({', '.join(sorted({c['host'] + ':' + str(c['port']) for c in allowed}))})" if allowed else ""))
            for c in connections:
                if c["verdict"] != "allowed":
                    lines.append(f"egress {c['verdict']}: {c['method'] or '?'} {c['host']}:{c['port']}: {c['reason']}")
    for letter in found["dead_letters"]:
        lines.append(f"dead letter on {letter['topic']}@{letter['offset']}: {letter['reason']}")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def inspect_main(config: Config, args: argparse.Namespace) -> int:
    from rollstream.archive import ArchiveStore

    group_id, _, index = args.id.rpartition("/")
    rollout_id = args.id if group_id and index.isdigit() else None
    group_id = group_id if rollout_id else args.id
    if args.archive or args.run:
        roots = [archive_of(config, args.run, args.archive)]
    else:
        roots = [str(run / "archive") for run in run_dirs(config) if (run / "archive").exists()]
        if not roots:
            raise ConfigError(f"no run archives under {config.infra.state_dir}/runs: give --run or --archive")
    for root in roots:
        found = gather(ArchiveStore(root), group_id, rollout_id)
        if found is not None:
            print(json.dumps(found, indent=1) if args.json else render(found))
            return 0
    print(f"inspect: {args.id} is in none of {len(roots)} archive(s) searched ({', '.join(roots[:3])}"
          f"{', ...' if len(roots) > 3 else ''})")
    return 1


def run_summary(run: Path) -> dict[str, Any]:
    """One line of ``rollstream runs``."""
    from rollstream.archive import COMPLETE_FILE, ArchiveStore

    info: dict[str, Any] = {}
    if (run / "run.json").is_file():
        try:
            info = json.loads((run / "run.json").read_text())
        except ValueError:
            info = {}
    steps_file = Path(info.get("checkpoints") or run / "checkpoints") / "steps.jsonl"
    step = version = None
    if steps_file.is_file():
        lines = [line for line in steps_file.read_text().splitlines() if line.strip()]
        if lines:
            try:
                last = json.loads(lines[-1])
                step, version = last.get("step"), last.get("policy_version")
            except ValueError:
                pass
    out: dict[str, Any] = {"run_id": run.name, "path": str(run), "started_at": info.get("started_at"),
                           "ended_at": info.get("ended_at"), "exit_code": info.get("exit_code"), "steps": step,
                           "policy_version": version, "groups": None, "infra": None, "archive": "none"}
    root = info.get("archive") or (str(run / "archive") if (run / "archive").exists() else None)
    if root:
        store = ArchiveStore(root)
        if store.exists():
            fates = store.read("fates", columns=["group_id", "verdict"]).to_pylist()
            counts: dict[str, int] = {}  # in the one vocabulary: trained, filtered, dropped:<reason>
            for row in fates:
                name = _outcome_name(row["verdict"])
                counts[name] = counts.get(name, 0) + 1
            out["groups"] = counts
            verdicts = store.read("rewards", columns=["verdict"]).column("verdict").to_pylist()
            out["infra"] = sum(v == "infra" for v in verdicts)  # rollouts no reward: the machinery failed
            report = store.read_json(COMPLETE_FILE)
            out["archive"] = "unchecked" if report is None else ("complete" if report.get("complete") else "incomplete")
            out["archive_records"] = None if report is None else report.get("records")
    if out["started_at"] is None:
        try:
            out["started_at"] = time.mktime(time.strptime(run.name[:15], "%Y%m%d-%H%M%S"))
        except ValueError:
            out["started_at"] = run.stat().st_mtime
    return out


def _outcome_name(fate: str | None) -> str:
    """A recorded fate in the one vocabulary: ``trained``, ``filtered``, ``dropped:<reason>``."""
    from rollstream.schemas.events import GroupFateKind, group_outcome

    if fate not in get_args(GroupFateKind):
        return fate or "?"
    outcome, reason = group_outcome(fate)  # type: ignore[arg-type]
    return f"{outcome}:{reason}" if reason else outcome


def runs_main(config: Config, as_json: bool) -> int:
    runs = [run_summary(run) for run in run_dirs(config)]
    if as_json:
        print(json.dumps(runs, indent=1))
        return 0
    if not runs:
        print(f"no runs under {config.infra.state_dir}/runs")
        return 0
    from rollstream.cli.tables import table

    rows = []
    for r in runs:
        groups = r["groups"] or {}
        dropped = sum(v for k, v in groups.items() if k != "trained")
        status = "running?" if r["ended_at"] is None and r["exit_code"] is None else (
            "ok" if r["exit_code"] == 0 else f"rc {r['exit_code']}")
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["started_at"]))
        rows.append([r["run_id"], started, _or(r["steps"]), _or(r["policy_version"]),
                     _or(groups.get("trained") if r["groups"] is not None else None),
                     _or(dropped if r["groups"] is not None else None), _or(r["infra"]), status, r["archive"]])
    print(table(["run", "started", "steps", "version", "trained", "dropped", "infra", "status", "archive"], rows,
                right=["steps", "version", "trained", "dropped", "infra"]))
    return 0


def _or(value: Any) -> str:
    return "-" if value is None else str(value)
