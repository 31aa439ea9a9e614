"""Validated configuration: one pydantic model per subsystem (a section), and `LibraConfig` of them all.

The defaults written here are the embedded defaults: `LibraConfig()` is what runs when no file is
given, and `configs/default.yaml` spells the same values out (a test keeps the two equal). Unknown
keys and out-of-range values are errors that name the key, the value and what is allowed. Nothing
here does I/O: `libra.config_loading` reads YAML files and overrides into a `LibraConfig`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from libra.planner.cost_model import RolloutDials, TrainingDials
from libra.planner.planner import SearchDials
from libra.planner.trigger import TriggerSettings
from libra.validated import Validated


class _Section(Validated):
    pass


class StoreConfig(_Section):
    """Trajectory store on Parquet files, queried with DuckDB."""

    root: str = Field(".libra/store", min_length=1, description="directory holding every run's Parquet files")
    compression: Literal["zstd", "snappy", "lz4", "gzip", "none"] = Field(
        "zstd", description="Parquet compression codec"
    )
    row_group_rows: int = Field(
        1_048_576, ge=1_024, le=67_108_864, description="rows per Parquet row group"
    )
    fsync: bool = Field(True, description="fsync each shard before it becomes visible (durability on power loss)")
    duckdb_threads: int = Field(2, ge=1, le=256, description="threads DuckDB may use for queries")
    query_timeout_s: float = Field(30.0, gt=0, le=86_400, description="`libra query` stops a statement that "
                                   "runs longer (DuckDB is interrupted)")


class TracesConfig(_Section):
    """How per-turn trace files map onto RL steps when imported or replayed."""

    prompts_per_step: int = Field(
        8, ge=1, le=100_000, description="prompts per RL step (each with all its samples), in file order"
    )


TRACKING_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc")


class TrackingConfig(_Section):
    """MLflow experiment tracking."""

    tracking_uri: str = Field(
        "sqlite:///.libra/mlflow.db", description="MLflow tracking URI; a relative sqlite path is under the working directory"
    )
    artifact_root: str = Field(".libra/mlartifacts", description="where MLflow stores artifacts (plots, tables)")
    experiment_prefix: str = Field(
        "libra", min_length=1, max_length=64, description="experiment names start with it: <prefix>-traces, ..."
    )

    @field_validator("tracking_uri")
    @classmethod
    def _known_scheme(cls, uri: str) -> str:
        return check_tracking_uri(uri)

    def experiment(self, kind: str) -> str:
        """The MLflow experiment of one kind of run (`traces`, `pool`, `train-math`, ...)."""
        return f"{self.experiment_prefix}-{kind}"


def check_tracking_uri(uri: str, name: str = "tracking_uri") -> str:
    """`uri` if MLflow has a tracking store for its scheme; else a ValueError naming `name` (the
    config's field, or the MLFLOW_TRACKING_URI variable that overrides it)."""
    scheme, found, _ = uri.partition("://")
    if not uri.strip():
        raise ValueError(f"{name} is empty: give sqlite:///FILE.db, file:DIR, http(s)://SERVER, or a directory")
    if found and scheme.split("+")[0] not in TRACKING_SCHEMES:
        raise ValueError(f"{name} {uri!r}: MLflow has no tracking store for {scheme!r}; give sqlite:///FILE.db, "
                         "file:DIR, http(s)://SERVER, a database URI (postgresql, mysql, mssql), databricks, or a directory")
    return uri


class DashboardConfig(_Section):
    """The read-only web dashboard (`libra dashboard`)."""

    host: str = Field("127.0.0.1", min_length=1, max_length=255,
                      description="address to listen on (127.0.0.1: this machine only; 0.0.0.0 opens it to the network)")
    port: int = Field(8050, ge=0, le=65_535, description="port to listen on (0: any free port)")
    refresh_s: float = Field(2.0, ge=0.2, le=3_600.0, description="how often an open page checks the run for new data")
    max_points: int = Field(2_000, ge=4, le=100_000, description="points per series at most; longer runs are binned")
    max_series: int = Field(6, ge=1, le=50, description="series per comparison chart at most")
    max_streams: int = Field(32, ge=1, le=10_000, description="open pages (change streams) at once at most; the "
                             "next is answered 503 until one closes (each polls its runs every refresh_s)")


class OrchestrationConfig(_Section):
    """Prefect settings for running flows without a server."""

    prefect_home: str = Field(".libra/prefect", description="PREFECT_HOME: Prefect's local database and settings")
    task_retries: int = Field(1, ge=0, le=10, description="retries of a failed Prefect task")


class PlannerConfig(RolloutDials, TrainingDials, TriggerSettings, SearchDials, _Section):
    """Global resource planner: objective, search space, re-planning trigger and cost-model knobs.

    The dials are declared once, in the planner's settings records this section composes: the
    search's (`SearchDials`), the re-planning trigger's (`TriggerSettings`) and the cost model's
    (`TrainingDials`, `RolloutDials`). The section is itself each of them: the trigger takes it as
    it is, `PlannerSettings.of` and `CostModel.configured` take their fields from it."""

    batch_trajectories: int = Field(512, ge=1, le=1_000_000, description="trajectories per RL step to plan for")
    recent_steps: int = Field(0, ge=0, le=1_000_000, description="steps of history used for lengths (0 = all)")


class SchedulerConfig(_Section):
    """Routing trajectories between instance buckets (C-MLFQ and Libra's router)."""

    payload_bounds: tuple[int, int] = Field((500, 5_000), description="tool-payload size classes (tokens)")
    window: int = Field(64, ge=1, le=4_096, description="remaining-length samples kept per tree node")
    max_nodes: int = Field(100_000, ge=100, le=10_000_000, description="tree size bound; rare leaves are pruned")
    min_support: int = Field(2, ge=1, le=1_000, description="samples a shared node needs before it is trusted")
    migration_budget: float = Field(0.07, ge=0.0, le=1.0, description="re-prefilled tokens at most this share of tokens seen")
    warmup_fraction: float = Field(0.3, ge=0.0, lt=1.0, description="share of replayed steps used only for learning")

    @field_validator("payload_bounds", mode="before")
    @classmethod
    def _two(cls, bounds: object) -> object:
        if isinstance(bounds, list | tuple) and len(bounds) != 2:
            raise ValueError(f"payload_bounds must be two increasing positive token counts, got {list(bounds)}")
        return bounds

    @field_validator("payload_bounds")
    @classmethod
    def _increasing(cls, bounds: tuple[int, int]) -> tuple[int, int]:
        if not 1 <= bounds[0] < bounds[1]:
            raise ValueError(f"payload_bounds must be two increasing positive token counts, got {list(bounds)}")
        return bounds


class PoolConfig(_Section):
    """Elastic hybrid pool: core training ranks plus hybrids that join and leave training.

    `core_ranks`, `hybrids`, `provider` and `snapshot_dir` are the standalone `libra pool` command's
    (a training run's pool is its trainer's core rank and `placement.hybrids`, on the run's workers,
    under its checkpoints); the rest apply to both."""

    core_ranks: int = Field(2, ge=1, le=4_096, description="core training replicas (never rebuilt), of the standalone "
                            "`libra pool` command")
    hybrids: int = Field(2, ge=0, le=4_096, description="hybrid workers that may join training, of the standalone "
                         "`libra pool` command (a training run's: placement.hybrids)")
    provider: Literal["local", "ray"] = Field("local", description="where the standalone `libra pool` command's "
                                              "hybrids run: local processes or Ray actors")
    device: Literal["cpu", "cuda"] = Field("cpu", description="where the pool's processes compute (cpu: gloo groups; "
                                           "cuda: NCCL, one GPU per worker process): the standalone `libra pool` "
                                           "command's, and a training run's trainer when placement.hybrids > 0 (its "
                                           "replicas are then the pool's, and trainer.device is not used)")
    group_timeout_s: float = Field(30.0, ge=1.0, le=3_600.0, description="a collective or rendezvous slower than this fails "
                                   "(at least 1 s)")
    join_timeout_s: float = Field(180.0, gt=0.0, le=86_400.0, description="a join not entered by then is cancelled")
    max_catchup_steps: int = Field(64, ge=2, le=100_000, description="updates the leader keeps for joins in progress")
    enter_gap: int = Field(1, ge=0, le=1_000, description="a joiner enters once at most this many updates behind")
    poll_s: float = Field(0.05, gt=0.0, le=10.0, description="coordinator polling interval")
    snapshot_dir: str = Field(".libra/pool", description="where join snapshots and run results are written")


class SandboxConfig(_Section):
    """Isolation of the code that tools run for the model (libra/rollout/sandbox.py)."""

    isolation: Literal["bwrap", "none"] = Field(
        "bwrap", description="bwrap: each call in its own bubblewrap sandbox; none: no isolation (limits only)"
    )
    server: bool = Field(True, description="true: calls start from one sandbox server (about 7 ms of CPU a call); false: a bwrap per call")
    uid: int = Field(65534, ge=1, le=2**31 - 1, description="host uid (and gid) sandboxes run as when Libra runs as root "
                     "(at most 2,147,483,647: bubblewrap cannot map a larger one)")
    python: str = Field("", description="interpreter for tool code (empty: Libra's own, else the system's python3)")
    workdir_bytes: int = Field(16 * 2**20, ge=2**20, le=2**40, description="bytes a trajectory's tool calls may "
                               "write in its working directory, together (a tmpfs of its own, mounted nosuid,nodev, "
                               "where Libra runs as root; elsewhere only each file is capped)")
    workdirs_bytes: int = Field(0, ge=0, le=2**44, description="host memory the working directories open at once "
                                "may pin together, where they are tmpfs mounts (each counts its workdir_bytes); "
                                "0: a quarter of the machine's memory")
    calls_bytes: int = Field(0, ge=0, le=2**44, description="host memory the tool calls in flight may hold together, "
                             "where Libra runs as root (a cap on their cgroups' directory; each call is also capped "
                             "alone): past it the kernel ends a call, never Libra; 0: a quarter of the machine's memory")


class RolloutConfig(_Section):
    """Rollout engines and the agent loop, for `libra train` (and the defaults of `libra rollout`)."""

    engine: Literal["vllm", "hf"] = Field("vllm", description="rollout engine: vLLM, or transformers (reproducible sampling)")
    instances: int = Field(1, ge=1, le=256, description="engine instances (the router places trajectories across them)")
    device: Literal["cpu", "cuda"] = Field("cpu", description="cpu: instances share the cores; cuda: the GPUs (a "
                                           "placed run's workers are of this kind)")
    router: str = Field("libra", min_length=1, max_length=64, description="router across instances (libra rollout --help lists them)")
    max_turns: int = Field(8, ge=1, le=1_000, description="model turns per trajectory")
    max_tokens_per_turn: int = Field(96, ge=1, le=1_000_000, description="tokens one turn may generate")
    max_context: int = Field(1536, ge=64, le=10_000_000, description="context tokens a trajectory may reach")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="sampling temperature (the trainer scales logits by it too)")
    tool_threads: int = Field(16, ge=1, le=1_024, description="tool calls in flight at once")
    tool_timeout_s: float = Field(300.0, gt=0.0, le=86_400.0, description="a tool call whose host side has not "
                                  "returned by then fails its trajectory (the sandbox's own limits end the code sooner)")
    trajectory_timeout_s: float = Field(3_600.0, gt=0.0, le=604_800.0, description="a trajectory still running then "
                                        "fails; failed trajectories are left out of training with their whole group")
    min_tokens_per_turn: int = Field(0, ge=0, le=1_000_000, description="a load knob: a training turn generates at "
                                     "least this many tokens before it may stop (0: the policy stops when it will)")
    turn_growth: float = Field(0.0, ge=0.0, le=1.0, description="a drift knob: min_tokens_per_turn and "
                               "max_tokens_per_turn grow by this fraction per training iteration (0: fixed)")
    partial: bool = Field(False, description="partial rollouts: an iteration's batch closes once prompts_per_step "
                          "groups are complete; the other groups are suspended whole (tokens, log-probs, each "
                          "token's weights version, working files) and continued by later iterations under newer "
                          "weights, unless more than trainer.max_staleness updates old (then dropped, counted)")
    overprovision: float = Field(1.0, ge=1.0, le=8.0, description="with partial: groups in flight per iteration "
                                 "(suspended ones continued, new ones started), as a multiple of prompts_per_step")
    suspend_bytes: int = Field(4 * 2**20, ge=0, le=2**32, description="with partial: bytes of working-directory "
                               "files a suspended trajectory may keep (checkpoints hold them); one with more ends "
                               "where it stands, unanswered (a reward of 0), and its group is carried")
    suspend_total_bytes: int = Field(256 * 2**20, ge=0, le=2**40, description="with partial: bytes of "
                                     "working-directory files the trajectories a batch suspends may keep together "
                                     "(held in memory and in every checkpoint): each may keep an even share, and "
                                     "one with more ends where it stands, unanswered, as one over suspend_bytes does")

    @model_validator(mode="after")
    def _overprovision_is_partials(self) -> RolloutConfig:
        if self.overprovision > 1.0 and not self.partial:
            raise ValueError(f"rollout.overprovision {self.overprovision:g} starts groups beyond the batch that only "
                             "partial rollouts carry over; set rollout.partial: true, or overprovision: 1")
        return self

    @model_validator(mode="after")
    def _floor_below_limit(self) -> RolloutConfig:
        if self.min_tokens_per_turn > self.max_tokens_per_turn:
            raise ValueError(f"rollout.min_tokens_per_turn ({self.min_tokens_per_turn}) exceeds max_tokens_per_turn "
                             f"({self.max_tokens_per_turn}); lower it or raise max_tokens_per_turn")
        return self


class TrainerConfig(_Section):
    """The RL training run: GRPO on the policy, one update per iteration (libra/trainer/)."""

    env: Literal["search", "math", "repo"] = Field("math", description="the environment trained on")
    policy: str = Field(".libra/policy", min_length=1, description="HF-format initial policy (built by `libra policy init` when it is the default)")
    run: str = Field("", max_length=128, description="run name in the store, MLflow and checkpoints (empty: train-<env>-seed<seed>)")
    steps: int = Field(20, ge=1, le=1_000_000, description="RL iterations (policy updates)")
    prompts_per_step: int = Field(8, ge=1, le=100_000, description="prompts rolled out per iteration")
    samples_per_prompt: int = Field(8, ge=2, le=1_024, description="samples of each prompt: the group of GRPO's advantage")
    lr: float = Field(2e-5, gt=0.0, le=1.0, description="peak learning rate (AdamW)")
    schedule: Literal["constant", "cosine"] = Field("constant", description="learning-rate shape after the warmup")
    warmup_steps: int = Field(2, ge=0, le=1_000_000, description="updates of linear learning-rate warmup")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay")
    grad_clip: float = Field(1.0, gt=0.0, le=1e6, description="global gradient-norm clip")
    clip_low: float = Field(0.2, ge=0.0, le=1.0, description="ratio clip below: 1 - clip_low")
    clip_high: float = Field(0.28, ge=0.0, le=10.0, description="ratio clip above: 1 + clip_high")
    kl_coef: float = Field(0.0, ge=0.0, le=100.0, description="weight of KL to the frozen initial policy (0: no reference model)")
    epochs: int = Field(1, ge=1, le=64, description="optimizer steps per update over the same samples (PPO's epochs; "
                        "the clipped ratio keeps later passes near the sampling policy); the torch trainer's")
    decoupled_cap: float = Field(0.0, ge=0.0, le=1e6, description="decoupled PPO for stale tokens: clip the ratio "
                                 "to the proximal policy (the weights the update starts from) and weight each token by "
                                 "pi_proximal / pi_behaviour, truncated at this cap (0: off; the ratio is to the "
                                 "behaviour policy, as generated)")
    track_kl: bool = Field(False, description="measure the KL to the frozen initial policy (the `kl` metric) even "
                           "when kl_coef is 0: a diagnostic that costs a reference forward pass per micro-batch")
    normalize_std: bool = Field(True, description="divide advantages by the group's reward standard deviation")
    dynamic_sampling: bool = Field(False, description="leave out of the update every group whose samples' rewards are "
                                   "all equal (its advantages are 0: no gradient, only a thinner token mean), and "
                                   "fill the batch from the over-sampled groups (DAPO's dynamic sampling)")
    oversample: float = Field(1.0, ge=1.0, le=8.0, description="groups rolled out per iteration, as a multiple of "
                              "prompts_per_step; with dynamic_sampling the update takes the first prompts_per_step "
                              "groups whose rewards differ")
    curriculum: bool = Field(False, description="draw each iteration's prompts by task category in proportion to "
                             "how often the category's recent groups had rewards that differed (the rest carry no "
                             "gradient), chosen from 8 times as many fresh tasks; needs an environment whose tasks have "
                             "categories (math). See libra/rl/curriculum.py")
    curriculum_decay: float = Field(0.8, gt=0.0, lt=1.0, description="with curriculum: what an iteration's group "
                                    "counts weigh one iteration later (the policy moves; recent groups count most)")
    partial_credit: float = Field(0.0, ge=0.0, lt=1.0, description="what a wrong answer is trained on: this times "
                                  "the share of its task that it got right (the math tasks: the expression's numbers "
                                  "and operators in their places in its last python call that ran), so a group of near misses still "
                                  "carries a gradient; the stored reward and the held-out reward stay the "
                                  "environment's exact one (0: off; below 1, so only the right answer earns 1)")
    overlong_filter: bool = Field(False, description="leave out of the update's loss every trajectory that "
                                  "ended at a limit (turns or context) without an answer, its group's advantages "
                                  "still counting it as reward 0 (DAPO's overlong filtering): the few that run out "
                                  "of turns are several times as long as the rest, and their tokens would "
                                  "otherwise outweigh the answers' in the token mean")
    micro_batch_tokens: int = Field(8192, ge=64, le=10_000_000, description="padded tokens per forward/backward pass")
    pipeline: Literal["one_step_off", "sync", "async"] = Field("one_step_off", description="one_step_off: rollout k+1 "
                                                               "runs while k trains; async: it also goes on generating "
                                                               "until update k is done, however many groups are "
                                                               "complete before (needs rollout.partial); this run's "
                                                               "(`libra plan` plans for planner.mode)")
    max_staleness: int = Field(1, ge=0, le=1_000, description="a trajectory more updates old than this is never trained on")
    device: Literal["cpu", "cuda"] = Field("cpu", description="where the trainer runs; it may differ from "
                                           "rollout.device (engines on the GPUs and the trainer on the cores, or the "
                                           "reverse); with placement.hybrids the pool's replicas train, on pool.device")
    backend: Literal["torch", "megatron"] = Field("torch", description="torch: the HF model in the run's process "
                                                  "(DDP over the pool's ranks); megatron: megatron-core's GPTModel on "
                                                  "tp x pp x dp rank processes")
    tp: int = Field(1, ge=1, le=1_024, description="tensor-parallel ranks (backend megatron)")
    pp: int = Field(1, ge=1, le=1_024, description="pipeline-parallel stages (backend megatron)")
    dp: int = Field(1, ge=1, le=4_096, description="data-parallel replicas (backend megatron)")
    layout: Literal["fixed", "planned"] = Field("fixed", description="backend megatron: fixed: trainer.tp/pp/dp; "
                                                "planned: the planner's training layout on the trainer's workers "
                                                "(at the start, and anew with each plan applied; needs a placement "
                                                "policy)")
    eval_every: int = Field(10, ge=1, le=1_000_000, description="held-out evaluation every N steps (and at the start and end)")
    eval_prompts: int = Field(32, ge=1, le=100_000, description="held-out prompts (one sample each)")
    eval_temperature: float = Field(0.0, ge=0.0, le=10.0, description="held-out sampling temperature (0: greedy, "
                                    "so the evaluation measures the policy, not the draw)")
    checkpoint_dir: str = Field(".libra/checkpoints", description="checkpoints go to <checkpoint_dir>/<run>/")
    keep_checkpoints: int = Field(2, ge=1, le=1_000, description="newest checkpoints kept")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="seeds the data order, the sampling and the trainer")

    @model_validator(mode="after")
    def _fresh_enough(self) -> TrainerConfig:
        if self.pipeline in ("one_step_off", "async") and self.max_staleness < 1:
            raise ValueError(f"pipeline {self.pipeline} trains on batches 1 update old: max_staleness must be >= 1 "
                             "(or set pipeline: sync)")
        return self

    @model_validator(mode="after")
    def _oversampled_for_dynamic_sampling(self) -> TrainerConfig:
        if self.oversample > 1.0 and not self.dynamic_sampling:
            raise ValueError(f"trainer.oversample {self.oversample:g} rolls out groups that only dynamic sampling "
                             "uses; set trainer.dynamic_sampling: true, or oversample: 1")
        return self

    @model_validator(mode="after")
    def _layout_is_megatrons(self) -> TrainerConfig:
        if self.backend == "torch" and (self.tp, self.pp, self.dp) != (1, 1, 1):
            raise ValueError(f"trainer.tp/pp/dp ({self.tp}/{self.pp}/{self.dp}) are the megatron backend's layout; "
                             "set trainer.backend: megatron, or leave them at 1")
        if self.layout == "planned" and self.backend != "megatron":
            raise ValueError("trainer.layout planned runs the planner's tp x pp x dp on megatron's ranks; set "
                             "trainer.backend: megatron (the torch trainer has no layout to plan)")
        if self.layout == "planned" and (self.tp, self.pp, self.dp) != (1, 1, 1):
            raise ValueError(f"trainer.tp/pp/dp ({self.tp}/{self.pp}/{self.dp}) fix the layout that trainer.layout "
                             "planned leaves to the planner; set one of them, not both")
        return self

    def run_name(self) -> str:
        return self.run or f"train-{self.env}-seed{self.seed}"

    @property
    def wants_reference(self) -> bool:
        """Whether the trainer loads the frozen initial policy (the KL term, or its measure)."""
        return self.kl_coef > 0 or self.track_kl


class PlacementConfig(_Section):
    """Where a training run's stages run on this machine's workers, and who moves them."""

    strategy: Literal["none", "libra", "static", "colocated"] = Field(
        "none", description="none: engines and trainer share every core (trainer.pipeline decides the overlap); "
        "colocated: every worker rolls out, then every worker trains; static: half the workers roll out, the rest "
        "train, never moved; libra: that split, re-planned from the run's statistics")
    cores_per_worker: int = Field(1, ge=1, le=1_024, description="CPU cores per worker (the unit the planner moves)")
    hybrids: int = Field(0, ge=0, le=4_096, description="rollout workers that also train, as hybrids of the elastic pool "
                         "beside the trainer's core rank (static and libra; pool.* sets the joins and pool.device their device; "
                         "the standalone `libra pool` command's are pool.hybrids); 0: the trainer trains in the run's "
                         "process")
    hybrid_schedule: dict[int, int] = Field(
        default_factory=dict, description="hybrids wanted in training from an iteration on ({0: 1, 6: 0}: one, "
        "then none from iteration 6); empty: the placement's (every hybrid at first; with libra, then the plan's)")

    @model_validator(mode="before")
    @classmethod
    def _strategy_was_policy(cls, data: Any) -> Any:
        """The old key `placement.policy` still works: it is read as `placement.strategy`, with one
        line naming the new key."""
        if isinstance(data, dict) and "policy" in data:
            from libra.renames import deprecated

            deprecated("placement.policy", "placement.strategy")
            if "strategy" in data:
                raise ValueError("placement.policy is the old name of placement.strategy; give only placement.strategy")
            data = {("strategy" if k == "policy" else k): v for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _schedule_within_hybrids(self) -> PlacementConfig:
        bad = {k: v for k, v in self.hybrid_schedule.items() if k < 0 or not 0 <= v <= self.hybrids}
        if bad:
            raise ValueError(f"placement.hybrid_schedule {bad}: iterations must be >= 0 and counts 0..placement.hybrids "
                             f"({self.hybrids})")
        return self


class ClusterConfig(_Section):
    """Where a placed training run's workers are: this machine's cores, or the hosts of a Ray cluster."""

    ray_address: str = Field("", max_length=256, description="the Ray cluster a placed run (placement.strategy libra, "
                             "static or colocated) runs on: its head's host:port, or 'auto'; empty: RAY_ADDRESS if set, "
                             "else this machine's processes")
    start_timeout_s: float = Field(120.0, gt=0.0, le=3_600.0, description="how long placing an engine or the trainer's "
                                   "ranks on the cluster's hosts may take before the run says which host is missing")


class LibraConfig(_Section):
    """Every subsystem's settings; each section validates itself."""

    store: StoreConfig = StoreConfig()
    traces: TracesConfig = TracesConfig()
    planner: PlannerConfig = PlannerConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    pool: PoolConfig = PoolConfig()
    tracking: TrackingConfig = TrackingConfig()
    dashboard: DashboardConfig = DashboardConfig()
    orchestration: OrchestrationConfig = OrchestrationConfig()
    sandbox: SandboxConfig = SandboxConfig()
    rollout: RolloutConfig = RolloutConfig()
    trainer: TrainerConfig = TrainerConfig()
    placement: PlacementConfig = PlacementConfig()
    cluster: ClusterConfig = ClusterConfig()

    @property
    def train_experiment(self) -> str:
        """The MLflow experiment this config's training runs log to (and `libra compare` reads)."""
        return self.tracking.experiment(f"train-{self.trainer.env}")

    @model_validator(mode="after")
    def _placed_pipeline_fresh_enough(self) -> LibraConfig:
        if self.placement.strategy in ("libra", "static") and self.trainer.max_staleness < 1:
            raise ValueError(f"placement.strategy {self.placement.strategy} overlaps rollout and training (one-step-off): "
                             "trainer.max_staleness must be >= 1 (or use placement.strategy colocated)")
        if self.placement.hybrids and self.placement.strategy not in ("libra", "static"):
            raise ValueError(f"placement.hybrids {self.placement.hybrids}: hybrids are rollout workers that also train, "
                             f"which needs a split placement (placement.strategy static or libra, not "
                             f"{self.placement.strategy})")
        if self.trainer.layout == "planned" and self.placement.strategy == "none":
            raise ValueError("trainer.layout planned takes the layout the planner chooses for the trainer's workers; "
                             "set placement.strategy to libra, static or colocated")
        if self.cluster.ray_address and self.placement.strategy == "none":
            raise ValueError(f"cluster.ray_address {self.cluster.ray_address!r}: a run on a Ray cluster is placed on its "
                             "hosts' workers; set placement.strategy to libra, static or colocated")
        if self.trainer.epochs > 1 and (self.trainer.backend != "torch" or self.placement.hybrids or self.cluster.ray_address):
            raise ValueError(f"trainer.epochs {self.trainer.epochs}: several optimizer steps per update are the torch "
                             "trainer's in the run's process; megatron, hybrids and Ray clusters take one (set "
                             "trainer.epochs 1)")
        if self.trainer.pipeline == "async" and not self.rollout.partial:
            raise ValueError("trainer.pipeline async generates past the batch until the update is done and carries "
                             "what is unfinished to the next batch: set rollout.partial: true")
        if self.rollout.partial and self.trainer.partial_credit:
            raise ValueError(f"trainer.partial_credit {self.trainer.partial_credit:g} grades a trajectory's tool calls, "
                             "which rollout.partial's resumed trajectories made in an earlier episode: use one of them")
        if self.rollout.partial and self.trainer.dynamic_sampling:
            raise ValueError("rollout.partial closes the batch at prompts_per_step complete groups and "
                             "trainer.dynamic_sampling picks among over-sampled ones: use one of them")
        if self.rollout.partial and self.rollout.suspend_bytes >= self.sandbox.workdir_bytes:
            raise ValueError(f"rollout.suspend_bytes {self.rollout.suspend_bytes:,} keeps more of a suspended "
                             f"trajectory's files than its working directory holds again (sandbox.workdir_bytes "
                             f"{self.sandbox.workdir_bytes:,}); set it below, well below with room for the task's files")
        if self.rollout.partial and self.trainer.pipeline != "sync" and self.trainer.max_staleness == 1:
            # rollout k+1 runs beside update k, on weights k; what it suspends is continued by rollout k+2
            # and trained by update k+2: 2 updates old, so a bound of 1 would drop every suspended group
            raise ValueError(f"rollout.partial with trainer.pipeline {self.trainer.pipeline}: a suspended group is "
                             "trained 2 updates after the weights that started it, so trainer.max_staleness 1 would "
                             "drop every one; set trainer.max_staleness 2 or more (or pipeline: sync)")
        if self.placement.hybrids and self.rollout.device == "cuda":
            raise ValueError(f"placement.hybrids {self.placement.hybrids} with rollout.device cuda: a live run's hybrids "
                             "are placed on CPU workers only so far (the pool puts its processes on GPUs by rank, not "
                             "where the placement says); set placement.hybrids 0")
        if (self.placement.strategy != "none" and self.rollout.engine == "hf" and self.rollout.device == "cpu"
                and not self.cluster.ray_address):
            raise ValueError(f"placement.strategy {self.placement.strategy} gives the engines CPU cores of their own, but "
                             "the transformers engine (rollout.engine hf) runs inside the trainer's process and shares "
                             "its threads: use rollout.engine vllm, placement.strategy none, or a Ray cluster "
                             "(cluster.ray_address), where every engine is an actor of its own")
        return self
