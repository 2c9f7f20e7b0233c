"""Recipe section ``workload`` for simulation-based inference (``workload.kind: sbi``).

An SBI recipe names what to simulate (a benchmark task, or a user's prior and simulator by
import path), how many simulations, the method (neural posterior or likelihood estimation,
NPE or NLE), which density estimator to train for it, how its posterior samples, and how to
evaluate it at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from trainforge.config.rules import Section
from trainforge.config.schema import Switch, WorkloadSection
from trainforge.errors import RecipeError

SimulationDevice = Literal["auto", "cpu", "cuda"]
SimulationPlace = Literal["auto", "here", "cluster"]
ZScore = Literal["independent", "structured", "none"]
ObservationsFrom = Literal["sbibm", "own"]
MCMCMethod = Literal["slice_np_vectorized", "slice_np"]


@dataclass
class SimulationSection(Section):
    KEY = "workload.simulation"

    num_simulations: int = 10_000
    """Number of (θ, x) pairs to simulate (before dropping invalid ones)."""
    chunk_size: int = 100_000
    """Simulations per chunk: one seed and one file per chunk; an interrupted simulation resumes
    from its finished chunks. A simulator that is not vectorised gets smaller chunks (N/1024,
    at least 16, at most this) so that every CPU of the cluster gets some."""
    where: SimulationPlace = "auto"
    """auto | here | cluster. here: the command simulates on one CPU core of its own machine,
    in a process of its own, while Ray starts. cluster: Ray tasks over every CPU (or GPU) of
    the cluster. auto: here for a built-in task whose simulations take seconds of one core at
    most (every shipped task up to 10^6, two_moons up to 10^7: a cluster's worker processes
    take longer to start than that), the cluster otherwise."""
    device: SimulationDevice = "auto"
    """auto | cpu | cuda. Where torch simulators run on the cluster: auto takes a GPU when the
    Ray cluster has one and the simulator is vectorised torch code (built-in tasks, or
    vectorized: true). Simulations made here are made on the CPU."""
    cache_dir: str | None = None
    """Folder of the simulation cache; default <run.storage_path>/simulations. Entries are
    addressed by a hash of task, prior, simulator, N and seed, so later runs reuse them."""
    drop_invalid: bool = False
    """Drop simulations whose x holds NaN or inf (otherwise they stop the run with a count)."""
    path: str | None = None
    """A finished simulation folder to train on. `trainforge train` fills it in after the
    simulation stage; set it to train on an entry made by another recipe or machine."""
    cpus_per_chunk: float = 1.0
    """Ray CPUs each CPU simulation task reserves (more for a simulator that uses threads)."""
    proposal: str | None = None
    """A .pt file holding the θ to simulate, one row each ([num_simulations, dim_theta]), in
    place of draws from the prior; its content is part of the cache key. Sequential rounds
    (``workload.rounds``) write it for each round after the first."""

    def check(self) -> None:
        self.at_least("num_simulations", 2)
        self.at_least("chunk_size", 1)
        self.positive("cpus_per_chunk")
        if self.where == "here" and self.device == "cuda":
            raise RecipeError(
                f"{self.KEY}.where: here simulates on this machine's CPU, and device is cuda; "
                "set where: cluster (or auto) to simulate on the cluster's GPUs"
            )


@dataclass
class EstimatorSection(Section):
    KEY = "workload.estimator"
    FREE_FORM: ClassVar[tuple[str, ...]] = ("model_kwargs", "embedding_kwargs")

    model: str | None = None
    """Density estimator, by sbi's builder name: maf | nsf | mdn | made | maf_rqs | zuko_maf |
    zuko_nsf | zuko_nice | zuko_naf | zuko_gf | zuko_bpf; for method nre a classifier
    (sbi's classifier_nn): linear | mlp | resnet; for methods fmpe and npse a vector-field
    network (sbi's posterior_flow_nn, posterior_score_nn): mlp | ada_mlp | transformer |
    transformer_cross_attn; null: the method's default (maf; nre: resnet; fmpe, npse: mlp);
    or my_pkg.flows:build (your own
    builder by import path, as sbi takes one: called with the training θ and x, for z-scoring,
    ``model_kwargs``, and ``embedding_net`` where it takes it; it returns sbi's
    ConditionalDensityEstimator, or any nn.Module with ``loss(θ, condition=x)``, ``log_prob``
    and ``sample`` as sbi's has them; for method nle, of x given θ: ``loss(x, condition=θ)``)."""
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    """More arguments for the builder: sbi's (``posterior_nn``'s, e.g. ``num_blocks``,
    ``dropout_probability``) for a builder name, or your own builder's. Method nre also takes
    ``num_atoms`` here: θ per x in its contrastive loss (sbi's default 10). Methods fmpe and
    npse take sbi's vector-field settings, e.g. ``num_layers`` (sbi's default 5),
    ``time_emb_type``, ``t_embedding_dim``; npse also ``sde_type`` (ve | vp | subvp; sbi's
    ve) and its schedule's (``sigma_min``, ``sigma_max``, ``beta_min``, ``beta_max`` …)."""
    hidden_features: int = 50
    """Hidden units of the estimator's networks (sbi's default 50)."""
    num_transforms: int = 5
    """Flow transforms (maf, nsf, zuko flows; sbi's default 5)."""
    num_bins: int = 10
    """Spline bins (nsf)."""
    num_components: int = 10
    """Mixture components (mdn)."""
    z_score_theta: ZScore = "independent"
    """independent | structured | none: z-score θ inside the network (statistics of the whole
    training set, identical on every rank)."""
    z_score_x: ZScore = "independent"
    """independent | structured | none: z-score x inside the network."""
    embedding: str = "none"
    """Embedding net for x: none | fully_connected | cnn | permutation_invariant |
    my_pkg.module:MyNet (your own ``nn.Module`` class, or a function returning one, by import
    path: given ``embedding_kwargs``, and ``dim_x`` where it takes it; it maps a batch of x,
    shape (batch, dim_x), to features, shape (batch, k))."""
    embedding_kwargs: dict[str, Any] = field(default_factory=dict)
    """Your own embedding net's arguments, as nested as it likes."""
    embedding_features: int = 20
    """Output features of the embedding net."""
    embedding_hidden: int = 64
    """Hidden units of the embedding net."""
    embedding_input_shape: list[int] = field(default_factory=list)
    """cnn: shape of one x as [height, width] or [channels, height, width] (x is stored flat);
    permutation_invariant: [set_size, features_per_element]."""

    def check(self) -> None:
        # Builder names and embedding shapes: the estimator module's own rules, in one place.
        from trainforge.workloads.sbi import architecture

        architecture.check(self)


@dataclass
class PosteriorSection(Section):
    KEY = "workload.posterior"

    mcmc_method: MCMCMethod = "slice_np_vectorized"
    """Methods whose posterior samples by MCMC (nle): sbi's slice sampler, slice_np_vectorized
    (all chains in one batch through the network) | slice_np (chains one after another)."""
    num_chains: int = 20
    """MCMC chains per observation (sbi's default 20); samples are split evenly over them."""
    warmup_steps: int = 200
    """MCMC steps per chain dropped before the kept samples (sbi's default 200), after sbi's
    50 steps that tune the slice width."""
    thin: int = 1
    """Keep every thin-th MCMC step (1: all; sbi's default)."""

    def check(self) -> None:
        self.at_least("num_chains", 1)
        self.at_least("warmup_steps", 0)
        self.at_least("thin", 1)


@dataclass
class EvaluationSection(Section):
    KEY = "workload.evaluation"

    observations: list[int] = field(default_factory=lambda: [1])
    """Task observations (1..10) to sample the posterior at after training (built-in tasks)."""
    observations_from: ObservationsFrom = "sbibm"
    """sbibm | own. sbibm: the sbibm benchmark's stored observations, scored against its stored
    reference posterior samples (what its published C2ST values use; read from the sbibm 1.1.0
    wheel, fetched once into a cache). own: this project's seeded observations and reference
    samplers (offline)."""
    sbibm_path: str | None = None
    """observations_from sbibm: the sbibm 1.1.0 wheel, or a folder holding its sbibm/tasks/, to
    read them from (default: $TRAINFORGE_SBIBM, else the cache; `trainforge train` fills in
    what it found)."""
    num_samples: int = 10_000
    """Posterior samples per observation (and reference samples for C2ST; sbibm stores 10,000,
    so C2ST at sbibm's observations compares at most 10,000 of each)."""
    c2st: bool = True
    """C2ST against reference posterior samples (sbibm's definition; 10-d costs ~1-2 min per
    observation on one core)."""
    sbc_runs: int = 200
    """Simulation-based calibration and TARP (sbi's): (θ, x) pairs from the prior, 0 disables
    both. Run for amortized posteriors only (npe, fmpe): methods nle and nre would run MCMC at
    each pair, npse its 500-step SDE sampler over sbi's batched proposals (a minute on a CPU
    core at 50 pairs)."""
    sbc_samples: int = 1000
    """Posterior samples per SBC run."""
    pair_plot: bool = True
    """Posterior pair plot (with the reference when C2ST runs) for the first observation."""
    observed: str | None = None
    """custom task: a file holding the observed x (x_o: one output of the simulator, a torch
    tensor in a .pt file or a NumPy array in a .npy file) that sequential rounds
    (``workload.rounds``) focus on. Built-in tasks name one of ``observations`` instead."""

    def check(self) -> None:
        from trainforge.workloads.sbi.catalogue import NUM_OBSERVATIONS

        bad = [n for n in self.observations if not 1 <= n <= NUM_OBSERVATIONS]
        if bad:
            raise RecipeError(
                f"workload.evaluation.observations: {bad} out of range; tasks have observations "
                f"1..{NUM_OBSERVATIONS}"
            )
        self.at_least("num_samples", 2)
        self.at_least("sbc_samples", 2)
        self.at_least("sbc_runs", 0)


@dataclass
class SBIWorkloadConfig(WorkloadSection):
    kind: str = "sbi"
    """Workload family tag; selects this schema."""
    task: str = "two_moons"
    """Benchmark task (two_moons | gaussian_linear | gaussian_mixture | slcp | bernoulli_glm),
    or "custom" with prior and simulator given by import path."""
    prior: str | None = None
    """custom task: "package.module:name" of a torch Distribution, or of a function returning
    one (sample and log_prob, batch of θ as [n, dim_theta])."""
    simulator: str | None = None
    """custom task: "package.module:function" mapping θ [n, dim_theta] to x [n, dim_x] (torch
    tensor or numpy array, floating)."""
    code_dir: str | None = None
    """custom task: a folder to import prior and simulator from, besides the working directory
    and PYTHONPATH (filled in by `trainforge train` with where it found them, for the workers)."""
    vectorized: bool = False
    """custom task: the simulator is torch code that runs on the device θ is on (then it may
    run on a GPU)."""
    simulation: SimulationSection = field(default_factory=SimulationSection)
    method: str = "npe"
    """npe | nle | nre | nre_c | fmpe | npse, by sbi's names. npe: the estimator learns the
    posterior q(θ | x), sampled directly. nle: it learns the likelihood q(x | θ) (no embedding
    net on x), and the posterior samples q(x_o | θ) p(θ) by MCMC (``workload.posterior``):
    seconds per observation, so its evaluation skips SBC and TARP. nre (sbi's NRE, NRE_B): a
    classifier learns the ratio p(x | θ) / p(x) by telling each x's θ from num_atoms - 1 others
    of its batch; its posterior samples r(x_o, θ) p(θ) by MCMC as nle's does; nre_c: the same
    with sbi's NRE_C loss (model_kwargs num_classes, gamma). fmpe (flow matching) and npse
    (score-based diffusion): a vector-field network of (θ_t, x, t) learns the posterior, and
    sbi's VectorFieldPosterior samples it by an ODE (fmpe) or SDE (npse) solve; amortized, so
    SBC and TARP run for fmpe; npse skips them (its sampler's cost)."""
    estimator: EstimatorSection = field(default_factory=EstimatorSection)
    posterior: PosteriorSection = field(default_factory=PosteriorSection)
    val_fraction: float = 0.1
    """Fraction of the simulations held out for validation and early stopping (sbi: 0.1)."""
    data_on_device: Switch = "auto"
    """auto | true | false: keep the simulations on the GPU (auto: when they take less than
    40% of its free memory; otherwise batches are gathered in pinned host memory)."""
    stream_from_disk: Switch = "auto"
    """auto | true | false: read the simulations from disk a window of chunks at a time while
    training, instead of loading them all (auto: when they, times the workers on a machine,
    would take more than a quarter of its available memory)."""
    stream_window_rows: int = 1_000_000
    """Streaming: simulations held in memory (and on the GPU) at once; batches are shuffled
    within a window of randomly ordered chunks."""
    evaluation: EvaluationSection = field(default_factory=EvaluationSection)
    rounds: int = 1
    """Sequential inference at one observation (the one ``evaluation.observations`` names; a
    custom task's: the file ``evaluation.observed`` names): above 1, `trainforge train` runs
    this many rounds of num_simulations each. The first simulates from the prior; each later
    one simulates θ drawn from what the round before learned at that observation (method npe:
    the prior truncated to the posterior's highest-density region, as sbi's TSNPE; nle, nre,
    nre_c: their posterior, as SNLE and SNRE) and trains on the simulations of every round so
    far. Each round is a run of its own, nested under the command's MLflow run; a re-run keeps
    the finished rounds and resumes the one it reached. The last round's posterior is the
    run's posterior.pt."""
    ensemble: int = 1
    """Members: above 1, `trainforge train` trains this many posteriors on the same
    simulations, at run.seed, run.seed+1, … (each a run of its own, as many at once as the
    cluster's GPUs or CPUs hold), and writes their equal-weight mixture as the run's
    posterior.pt (sbi's EnsemblePosterior; `trainforge ensemble` does the same for finished
    runs)."""

    def check(self) -> None:
        # The task name is checked by the spec (the task registry imports the tasks' code).
        from trainforge.workloads.sbi import methods

        methods.check(self)
        self.fraction("val_fraction")
        self.at_least("stream_window_rows", 1)
        self.at_least("ensemble", 1)
        self.at_least("rounds", 1)
        if self.rounds > 1:
            self._check_rounds()
        self._check_observed()

    def _check_observed(self) -> None:
        from trainforge.workloads.sbi.catalogue import CUSTOM

        observed = self.evaluation.observed
        if observed is None:
            return
        key = "workload.evaluation.observed"
        if self.task != CUSTOM:
            raise RecipeError(
                f"{key}: a custom task's observed x; task {self.task} names one of its "
                "observations in workload.evaluation.observations"
            )
        if self.rounds == 1:
            raise RecipeError(f"{key}: only sequential rounds use it; set workload.rounds "
                              "above 1, or remove it")  # fmt: skip
        if not observed.endswith((".pt", ".npy")):
            raise RecipeError(f"{key}: {observed} is neither a .pt nor a .npy file")

    def _check_rounds(self) -> None:
        from trainforge.workloads.sbi import methods
        from trainforge.workloads.sbi.catalogue import CUSTOM

        method = methods.get(self.method)
        if method.proposes is None:
            sequential = [m.name for m in methods.METHODS.values() if m.proposes]
            raise RecipeError(
                f"workload.rounds: method {self.method} has no sequential rounds here; use one "
                f"of {', '.join(sequential)}, or rounds: 1"
            )
        custom = self.task == CUSTOM
        rounds = f"workload.rounds: {self.rounds}"
        refusals = {
            "workload.evaluation.observations": (
                not custom and len(self.evaluation.observations) != 1,
                f"sequential rounds ({rounds}) focus on one observation; name one (now "
                f"{self.evaluation.observations})",
            ),
            "workload.evaluation.observed": (
                custom and self.evaluation.observed is None,
                f"sequential rounds ({rounds}) of a custom task focus on an observed x; name "
                "its file (.pt or .npy)",
            ),
            "workload.ensemble": (
                self.ensemble > 1,
                f"an ensemble of sequential runs ({rounds}) is not supported; set ensemble: 1 "
                "or rounds: 1",
            ),
            "workload.simulation.path": (
                self.simulation.path is not None or self.simulation.proposal is not None,
                f"sequential rounds ({rounds}) make each round's simulations; remove "
                "simulation.path and simulation.proposal",
            ),
        }
        for key, (refused, why) in refusals.items():
            if refused:
                raise RecipeError(f"{key}: {why}")
