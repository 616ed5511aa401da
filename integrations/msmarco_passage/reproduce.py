"""Reproduce the papers' MS MARCO passage experiments end to end (a GPU and a network needed; see README.md).

Pipeline, one step after another, each calling this package's CLIs as subprocesses (every command is printed
before it runs, so it can be copied):

    data      topics and qrels files by Pyserini name (dev subset, dl19-passage, dl20)
    download  triples.train.small.tsv (and GloVe 42B for TK) from the official URLs, unless given
    bm25      BM25 top 1000 of every topic set on the prebuilt msmarco-v1-passage index (downloaded on first use)
    train     the *-msmarco recipes: cross-encoder, MORES 2xIB / 1xIB, PreTTR l=11 (with its compressor
              pre-trained first for e=256), TK-2
    sidecar   document representations of every model that stores them
    rerank    BM25 top 1000 reranked by every model, for every topic set
    eval      MRR@10, MRR, nDCG@10, MAP, R@k per topic set, with MORES's non-inferiority test vs the cross-encoder
    compare   the table against the papers' numbers (compare.py, paper_results.json)

A journal (``OUTPUT_DIR/pipeline.json``, kept by ``integrations/steps.py``) records each finished command with its
time; a rerun skips journaled commands, so it resumes (training from its last checkpoint), refuses to skip one whose
command has changed since, and runs again one whose outputs have become older than its inputs. Outputs made before
the journal are adopted when they exist and are newer than their inputs. ``--from STEP`` / ``--only STEP ...``
select steps; ``--dry-run`` prints every command and checks every input that can be checked offline::

    python integrations/msmarco_passage/reproduce.py --output-dir runs/msmarco --dry-run
    python integrations/msmarco_passage/reproduce.py --output-dir runs/msmarco --triples triples.train.small.tsv
    python integrations/msmarco_passage/reproduce.py compare --results-dir runs/msmarco

Helpers the pipeline runs (usable alone): ``fetch-topics NAME OUTPUT``, ``fetch-qrels NAME OUTPUT``,
``download URL --output PATH [--member NAME]``.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
if str(REPOSITORY) not in sys.path:  # run as a script: the repository root makes integrations/ importable
    sys.path.append(str(REPOSITORY))

from integrations.commands import cli_parser, parse_arguments  # noqa: E402
from integrations.steps import StepFailed, StepRunner  # noqa: E402


def _load_sibling(name: str):
    # integrations/ is not a package: load compare.py by path, under a name no other module uses
    path = Path(__file__).resolve().parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"msmarco_passage_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


comparison = _load_sibling("compare")
TOPIC_SETS = comparison.TOPIC_SETS

INDEX = "msmarco-v1-passage"
STEPS = ("data", "download", "bm25", "train", "sidecar", "rerank", "eval", "compare")
STEP_TITLES = {
    "data": "topics and qrels files by Pyserini name",
    "download": "training data from the official URLs",
    "bm25": "BM25 top 1000 (the first stage, and the baseline row)",
    "train": "training with the papers' MS MARCO recipes",
    "sidecar": "precomputed document representations",
    "rerank": "reranking BM25's top 1000",
    "eval": "metrics and the non-inferiority test",
    "compare": "comparison with the papers' numbers",
}
# MS MARCO's download host (older guides use msmarco.blob.core.windows.net). Sizes as datamaestro-ir's MS MARCO
# dataset definition lists them.
TRIPLES_URL = "https://msmarco.z22.web.core.windows.net/msmarcoranking/triples.train.small.tar.gz"
TRIPLES_MEMBER = "triples.train.small.tsv"
TRIPLES_ARCHIVE_BYTES, TRIPLES_TSV_BYTES = 7_930_881_353, 27_100_000_000
GLOVE_URL = "https://nlp.stanford.edu/data/glove.42B.300d.zip"  # the TK paper's embeddings (42B-token GloVe, 300-d)
GLOVE_MEMBER = "glove.42B.300d.txt"
GLOVE_DIM = 300
BERT_BASE_HIDDEN = 768  # bert-base-uncased: the per-token width MORES S1 and PreTTR store
STORE_DTYPE_BYTES = 2  # the sidecar build's default float16
TRAINED_MARKER = "training_summary.json"  # written by `train` after the final model
SIDECAR_MARKER = "manifest.json"  # written last by `sidecar build`, before the atomic rename
JOURNAL = "pipeline.json"  # under --output-dir


@dataclass(frozen=True)
class ModelSpec:
    """One trained model of the reproduction: how it is trained and how it reranks."""

    reranker: str  # registered reranker name = the train recipe's model_type
    recipe: str  # shipped train recipe
    train_args: tuple[str, ...] = ()  # --model-arg KEY=VALUE on top of the recipe
    compressor: bool = False  # PreTTR with a compressor pre-trained first (`pretrain-compressor`)
    glove: bool = False  # initialised from GloVe (TK) instead of the recipe's BERT backbone


#: The models by the name their directories, sidecars and runs get; paper_results.json maps them to paper rows
#: (cross-encoder = MORES's "BERT ranker", mores-2ib = "MORES 2xIB" = EARL "ClsPool Tied", tk = "TK 2 layers",
#: earl-avepool = EARL "AvePool Tied"; PreTTR has no MS MARCO numbers).
MODELS = {
    "cross-encoder": ModelSpec("cross-encoder", "cross-encoder-msmarco"),
    "mores-2ib": ModelSpec("mores", "mores-msmarco"),
    "mores-1ib": ModelSpec("mores", "mores-msmarco", ("n_interaction_blocks=1",)),
    "prettr-l11": ModelSpec("prettr", "prettr-msmarco"),
    "prettr-l11-e256": ModelSpec("prettr", "prettr-msmarco", ("compression_dim=256",), compressor=True),
    "tk": ModelSpec("tk", "tk-msmarco", glove=True),
    "earl-avepool": ModelSpec("mores", "mores-msmarco", ("pooling=avg",)),
}
DEFAULT_MODELS = ("cross-encoder", "mores-2ib", "mores-1ib", "prettr-l11", "prettr-l11-e256", "tk")
COMPRESSOR_RECIPE = "prettr-compressor-msmarco"


@dataclass
class Command:
    """One subprocess of the pipeline. ``argv[0] == "python"`` stands for this interpreter."""

    step: str  # the pipeline step (STEPS) it belongs to
    name: str  # its entry in the journal, unique in the plan
    argv: list[str]
    outputs: list[Path] = field(default_factory=list)  # existing (and newer than the inputs) before the journal: done
    inputs: list[Path] = field(default_factory=list)  # must exist when it runs; newer than the outputs: run again
    always: bool = False  # never skipped (cheap, and its result depends on everything before)

    def display(self) -> str:
        return shlex.join(self.argv)

    def executable(self) -> list[str]:
        return [sys.executable, *self.argv[1:]] if self.argv[0] == "python" else list(self.argv)


# ---- the plan -------------------------------------------------------------------------------------------------------

def _script(name: str) -> str:
    """A sibling script's path as a user can type it: relative to the working directory when below it."""
    path = Path(__file__).resolve().parent / name
    relative = os.path.relpath(path)
    return path.as_posix() if relative.startswith("..") else relative


def recipe_for(name: str, options: argparse.Namespace) -> str:
    return options.recipes.get(name, MODELS[name].recipe)


@dataclass(frozen=True)
class Layout:
    """Where everything goes under ``--output-dir``."""

    out: Path

    def qrels(self, topic_set: str) -> Path:
        return self.out / "data" / f"qrels.{topic_set}.txt"

    def run(self, model: str, topic_set: str) -> Path:
        return self.out / "runs" / comparison.run_file_name(model, topic_set)

    def model(self, name: str) -> Path:
        return self.out / "models" / name

    def sidecar(self, name: str) -> Path:
        return self.out / "sidecars" / name


def build_plan(options: argparse.Namespace) -> list[Command]:
    """Every command of the pipeline for these options, in run order."""
    layout = Layout(Path(options.output_dir))
    return [*_data_commands(options, layout), *_download_commands(options), *_bm25_commands(options, layout),
            *_train_commands(options, layout), *_sidecar_commands(options, layout),
            *_rerank_commands(options, layout), *_eval_commands(options, layout), _compare_command(options, layout)]


def _helper(*args: str) -> list[str]:
    return ["python", _script("reproduce.py"), *args]


def _data_commands(options: argparse.Namespace, layout: Layout) -> list[Command]:
    commands = [Command("data", f"qrels-{key}", _helper("fetch-qrels", TOPIC_SETS[key]["qrels"],
                                                        str(layout.qrels(key))), [layout.qrels(key)])
                for key in options.topic_sets]
    if options.early_stopping_topics is None and any(_stops_early(name, options) for name in options.models):
        topics, qrels = early_stopping_files(options)
        commands.append(Command("data", "topics-early-stopping",
                                _helper("fetch-topics", TOPIC_SETS["dev"]["topics"], str(topics)), [topics]))
        if "dev" not in options.topic_sets:
            commands.append(Command("data", "qrels-early-stopping",
                                    _helper("fetch-qrels", TOPIC_SETS["dev"]["qrels"], str(qrels)), [qrels]))
    return commands


def _download_commands(options: argparse.Namespace) -> list[Command]:
    commands = []
    if options.triples is None:
        triples = triples_path(options)
        commands.append(Command("download", "download-triples", _helper(
            "download", TRIPLES_URL, "--member", TRIPLES_MEMBER, "--output", str(triples)), [triples]))
    if options.glove is None and any(MODELS[name].glove for name in options.models):
        glove = glove_path(options)
        commands.append(Command("download", "download-glove", _helper(
            "download", GLOVE_URL, "--member", GLOVE_MEMBER, "--output", str(glove)), [glove]))
    return commands


def _search(options: argparse.Namespace, topic_set: str, run: Path) -> list[str]:
    return ["python", "-m", "pyserini_mores.search", "--index", options.index, "--topics",
            TOPIC_SETS[topic_set]["topics"], "--output", str(run), "--hits", "1000"]


def _bm25_commands(options: argparse.Namespace, layout: Layout) -> list[Command]:
    return [Command("bm25", f"bm25-{key}",
                    _search(options, key, layout.run("bm25", key)) + ["--threads", str(options.threads)],
                    [layout.run("bm25", key)]) for key in options.topic_sets]


def _train_commands(options: argparse.Namespace, layout: Layout) -> list[Command]:
    device = ["--device", options.device] if options.device else []
    triples, commands = triples_path(options), []
    for name in options.models:
        spec, init, inputs = MODELS[name], [], [triples]
        if spec.compressor:  # PreTTR's stage 1: the compressor alone, on unlabelled pairs
            compressor = layout.model(f"{name}-compressor")
            commands.append(Command("train", f"train-{name}-compressor", [
                "python", "-m", "pyserini_mores.train", "pretrain-compressor", "--recipe", options.compressor_recipe,
                "--texts", str(triples), "--output", str(compressor), "--resume", *device,
            ], [compressor / "model.safetensors"], [triples]))
            init, inputs = ["--init", str(compressor)], inputs + [compressor / "model.safetensors"]
        elif spec.glove:
            init, inputs = ["--init", str(glove_path(options))], inputs + [glove_path(options)]
        argv = ["python", "-m", "pyserini_mores.train", "train", "--recipe", recipe_for(name, options), *init,
                "--triples", str(triples), "--output", str(layout.model(name)), "--resume"]
        for item in spec.train_args:
            argv += ["--model-arg", item]
        if _stops_early(name, options):
            topics, qrels = early_stopping_files(options)
            argv += ["--dev-topics", str(topics), "--dev-qrels", str(qrels), "--dev-index", options.index,
                     "--threads", str(options.threads)]
            inputs += [topics, qrels]
        commands.append(Command("train", f"train-{name}", argv + device, [layout.model(name) / TRAINED_MARKER],
                                inputs))
    return commands


def _sidecar_commands(options: argparse.Namespace, layout: Layout) -> list[Command]:
    commands = []
    for name in stored_models(options):
        # --overwrite: the runner builds a sidecar where one exists only when the model was retrained after it (one
        # command line whatever is on disk, so that the journal sees the same command on every run)
        argv = ["python", "-m", "pyserini_mores.sidecar", "build", "--index", options.index,
                "--reranker", MODELS[name].reranker, "--model", str(layout.model(name)), *_store_args(name, options),
                "--output", str(layout.sidecar(name)), "--overwrite"]
        commands.append(Command("sidecar", f"sidecar-{name}", argv, [layout.sidecar(name) / SIDECAR_MARKER],
                                [layout.model(name) / TRAINED_MARKER]))
    return commands


def _rerank_commands(options: argparse.Namespace, layout: Layout) -> list[Command]:
    commands = []
    for name in options.models:
        stored = name in stored_models(options)
        inputs = [layout.model(name) / TRAINED_MARKER] + ([layout.sidecar(name) / SIDECAR_MARKER] if stored else [])
        for key in options.topic_sets:
            argv = _search(options, key, layout.run(name, key)) + [
                "--rerank-depth", str(options.rerank_depth), "--reranker", MODELS[name].reranker,
                "--model", str(layout.model(name)), *_store_args(name, options)]
            if stored:
                argv += ["--sidecar", str(layout.sidecar(name))]
            commands.append(Command("rerank", f"rerank-{name}-{key}", argv + ["--threads", str(options.threads)],
                                    [layout.run(name, key)], inputs))
    return commands


def _eval_commands(options: argparse.Namespace, layout: Layout) -> list[Command]:
    commands = []
    for key in options.topic_sets:
        result = layout.out / "eval" / f"{key}.json"
        runs = [layout.run(name, key) for name in ("bm25", *options.models)]
        argv = ["python", "-m", "pyserini_mores.eval", "--qrels", str(layout.qrels(key)), *map(str, runs)]
        if "cross-encoder" in options.models:  # MORES's non-inferiority test is against the BERT ranker
            argv += ["--baseline", str(layout.run("cross-encoder", key))]
        argv += ["--metrics", *comparison.EVAL_METRICS, "--relevance-level", str(TOPIC_SETS[key]["relevance_level"]),
                 "--json", str(result)]
        commands.append(Command("eval", f"eval-{key}", argv, [result], [layout.qrels(key), *runs]))
    return commands


def _compare_command(options: argparse.Namespace, layout: Layout) -> Command:
    report = layout.out / "comparison.md"
    argv = ["python", _script("compare.py"), "--results-dir", str(layout.out), "--output", str(report)]
    for tolerance in options.tolerance:
        argv += ["--tolerance", tolerance]
    return Command("compare", "compare", argv, [report], always=True)


def triples_path(options: argparse.Namespace) -> Path:
    return Path(options.triples) if options.triples else Path(options.output_dir) / "downloads" / TRIPLES_MEMBER


def glove_path(options: argparse.Namespace) -> Path:
    return Path(options.glove) if options.glove else Path(options.output_dir) / "downloads" / GLOVE_MEMBER


def early_stopping_files(options: argparse.Namespace) -> tuple[Path, Path]:
    """(topics TSV, qrels) for the recipes that stop early on dev MRR@10 (PreTTR, TK)."""
    if options.early_stopping_topics is not None:
        return Path(options.early_stopping_topics), Path(options.early_stopping_qrels)
    data = Path(options.output_dir) / "data"
    return data / "topics.dev.tsv", data / "qrels.dev.txt"


def stored_models(options: argparse.Namespace) -> list[str]:
    """The selected models that rerank from a sidecar (the cross-encoder scores text)."""
    return [name for name in options.models if MODELS[name].reranker != "cross-encoder"]


def _store_args(name: str, options: argparse.Namespace) -> list[str]:
    # S1 and S2 give identical scores; S1 stores 1/(2K) of S2's bytes, which matters at 8.8M passages.
    return ["--model-arg", f"reuse={options.mores_reuse}"] if MODELS[name].reranker == "mores" else []


def _stops_early(name: str, options: argparse.Namespace) -> bool:
    """Whether the model's recipe evaluates on dev queries during training (and so needs them)."""
    return bool(_recipe_settings(recipe_for(name, options)).get("eval_every"))


def _recipe_settings(recipe: str) -> dict:
    from pyserini_mores.train.recipes import read_recipe

    try:
        return read_recipe(recipe)["settings"]
    except (ValueError, OSError):
        return {}  # reported by the recipe check


def selected_steps(options: argparse.Namespace) -> list[str]:
    if options.only:
        return [step for step in STEPS if step in options.only]
    return list(STEPS[STEPS.index(options.from_step):]) if options.from_step else list(STEPS)


# ---- offline checks (--dry-run, and before a real run) -------------------------------------------------------------

@dataclass
class CheckReport:
    ok: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # needs the network; not a problem

    def print(self) -> None:
        print("\nChecks:")
        for label, items in (("ok", self.ok), ("warning", self.warnings), ("not checked offline", self.unchecked),
                             ("ERROR", self.errors)):
            for item in items:
                print(f"  {label}: {item}")


def check_plan(options: argparse.Namespace, commands: list[Command], steps: list[str],
               runner: StepRunner) -> CheckReport:
    """Everything that can be checked without the network, without running anything."""
    report = CheckReport()
    _check_recipes(options, report)
    _check_arguments([command for command in commands if command.step in steps], report)
    _check_output_dir(Path(options.output_dir), report)
    _check_given_files(options, report)
    _check_inputs(options, commands, steps, runner, report)
    num_docs = _check_pyserini_names(options, report)
    _check_disk(options, steps, num_docs, report)
    _check_hardware(steps, report)
    _check_backbones(options, report)
    return report


def _check_recipes(options: argparse.Namespace, report: CheckReport) -> None:
    from pyserini_mores.train.recipes import read_recipe

    wanted = [(recipe_for(name, options), "train", MODELS[name].reranker) for name in options.models]
    if any(MODELS[name].compressor for name in options.models):
        wanted.append((options.compressor_recipe, "pretrain-compressor", None))
    problems = []
    for recipe, command, model_type in dict.fromkeys(wanted):
        try:
            loaded = read_recipe(recipe)
        except (ValueError, OSError) as error:
            problems.append(str(error))
            continue
        if loaded["command"] != command:
            problems.append(f"recipe '{recipe}' is for the {loaded['command']} command, not {command}")
        elif model_type and loaded["settings"].get("model_type", model_type) != model_type:
            problems.append(f"recipe '{recipe}' trains a {loaded['settings']['model_type']} model, not {model_type}")
    report.errors.extend(problems)
    if not problems:
        report.ok.append(f"recipes exist and parse: {', '.join(sorted({recipe for recipe, _, _ in wanted}))}")


def _check_arguments(commands: list[Command], report: CheckReport) -> None:
    """Parse every command with the real parser of the CLI it calls (and build the training settings)."""
    problems = []
    for command in commands:
        try:
            _validate(command.argv)
        except (ValueError, KeyError, TypeError) as error:
            problems.append(f"`{command.display()}`: {error}")
    report.errors.extend(problems)
    if not problems:
        report.ok.append(f"all {len(commands)} commands' arguments are accepted by their CLIs' own parsers")


def _validate(argv: list[str]) -> None:
    """Raise ``ValueError`` with the CLI's own message when the command it runs would reject ``argv``."""
    if argv[0] != "python":
        raise ValueError(f"unknown program {argv[0]}")
    if argv[1] == "-m":
        module, args = argv[2], argv[3:]
        if module == "pyserini_mores.train":
            _validate_train(args)
            return
        parsed = parse_arguments(cli_parser(module), args)
        if module in ("pyserini_mores.search", "pyserini_mores.sidecar"):
            _model_args(parsed.model_arg)
        elif module == "pyserini_mores.eval":
            from pyserini_mores.eval.__main__ import parse_metrics

            parse_metrics(parsed.metrics)
            if not parsed.runs:
                raise ValueError("no run files")
    elif Path(argv[1]).name == "reproduce.py":
        parse_arguments(build_helper_parser(), argv[2:])
    elif Path(argv[1]).name == "compare.py":
        parsed = parse_arguments(comparison.build_parser(), argv[2:])
        comparison.parse_tolerances(parsed.tolerance, 0.01)
    else:
        raise ValueError(f"no parser known for {argv[1]}")


def _model_args(items: list[str]) -> dict:
    from pyserini_mores._cli import parse_model_args

    try:
        return parse_model_args(items)
    except SystemExit as error:  # it exits with its message, as a CLI helper
        raise ValueError(str(error)) from None


def _validate_train(args: list[str]) -> None:
    from pyserini_mores.train.__main__ import build_parser
    from pyserini_mores.train.recipes import merge_settings

    parsed = parse_arguments(build_parser(), args)
    if parsed.command not in ("train", "pretrain-compressor"):
        return
    given = {key: value for key, value in vars(parsed).items()
             if key not in ("command", "recipe", "resume", "quiet")}
    if "model_args" in given:
        given["model_args"] = _model_args(given["model_args"])
    values = merge_settings(parsed.command, parsed.recipe, given)
    if parsed.command == "train":
        from pyserini_mores.train.trainer import TrainingSettings

        TrainingSettings(**values)  # the same validation `train` does before it starts


def _check_output_dir(path: Path, report: CheckReport) -> None:
    existing = _nearest_existing(path)
    if path.exists() and not path.is_dir():
        report.errors.append(f"output directory {path} is a file")
    elif not existing.is_dir():
        report.errors.append(f"output directory {path} cannot be created: {existing} is not a directory")
    elif not os.access(existing, os.W_OK | os.X_OK):
        report.errors.append(f"output directory {path} is not writable ({existing} is read-only)")
    else:
        report.ok.append(f"output directory {path} is writable" + ("" if path.exists() else " (will be created)"))


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_given_files(options: argparse.Namespace, report: CheckReport) -> None:
    given = [("--triples", options.triples), ("--early-stopping-topics", options.early_stopping_topics),
             ("--early-stopping-qrels", options.early_stopping_qrels)]
    if any(MODELS[name].glove for name in options.models):
        given.append(("--glove", options.glove))
    for flag, value in given:
        if value is None:
            continue
        if Path(value).is_file():
            report.ok.append(f"{flag} {value} exists")
        else:
            report.errors.append(f"{flag} {value}: no such file")
    if options.triples is None:
        report.unchecked.append(f"triples: no --triples given, so the download step fetches {TRIPLES_URL} "
                                f"({TRIPLES_ARCHIVE_BYTES / 1e9:.1f} GB, {TRIPLES_TSV_BYTES / 1e9:.1f} GB unpacked); "
                                "if you have triples.train.small.tsv, pass --triples PATH")


def _check_inputs(options: argparse.Namespace, commands: list[Command], steps: list[str], runner: StepRunner,
                  report: CheckReport) -> None:
    """With --only/--from, what the skipped steps would have made must already exist (for the commands that will
    run: a finished one may have had its inputs deleted since, the triples to free their 27 GB say)."""
    made = {path for command in commands if command.step in steps for path in command.outputs}
    given = {Path(value) for value in (options.triples, options.glove, options.early_stopping_topics,
                                       options.early_stopping_qrels) if value is not None}  # checked on their own
    for command in commands:
        if command.step not in steps or done(runner, command):
            continue
        for path in command.inputs:
            if path not in made and path not in given and not path.exists():
                producer = next((c.step for c in commands if path in c.outputs), None)
                report.errors.append(f"step {command.step} needs {path}, which does not exist yet"
                                     + (f" (the {producer} step makes it; select it too)" if producer else ""))


def _check_pyserini_names(options: argparse.Namespace, report: CheckReport) -> int | None:
    """Topics, qrels and index names known to Pyserini (by name: nothing is downloaded). Returns the index size."""
    try:
        from pyserini_mores._jvm import ensure_jvm

        # Not import_pyserini: it first imports pyserini.encode (10 s of scikit-learn and transformers here), which
        # these two modules do not need.
        ensure_jvm()
        base = importlib.import_module("pyserini.search._base")
        prebuilt = importlib.import_module("pyserini.prebuilt_index_info").TF_INDEX_INFO
    except Exception as error:  # no Java, a broken Pyserini: nothing below can run either
        report.errors.append(f"Pyserini cannot be loaded: {error}")
        return None
    unknown = [f"Pyserini does not know the {kind} name '{TOPIC_SETS[key][kind]}'" for key in options.topic_sets
               for kind, mapping in (("topics", base.topics_mapping), ("qrels", base.qrels_mapping))
               if TOPIC_SETS[key][kind] not in mapping]
    report.errors.extend(unknown)
    if not unknown:
        report.ok.append("Pyserini knows the topics and qrels: " + ", ".join(
            f"{key} = {TOPIC_SETS[key]['topics']} / {TOPIC_SETS[key]['qrels']}" for key in options.topic_sets))
    report.unchecked.append("topics and qrels files: Pyserini downloads them on first use")

    from pyserini_mores.index import IndexNotFoundError, _cached_prebuilt_path, open_searcher, resolve_index

    if Path(options.index).is_dir():
        try:
            searcher = open_searcher(resolve_index(options.index, download=False))
            num_docs = int(searcher.num_docs)
            searcher.close()
        except (IndexNotFoundError, OSError) as error:
            report.errors.append(str(error))
            return None
        report.ok.append(f"index {options.index}: {num_docs:,} documents")
        return num_docs
    info = prebuilt.get(options.index)
    if info is None:
        report.errors.append(f"'{options.index}' is neither an index directory nor a Pyserini prebuilt index name")
        return None
    cached = _cached_prebuilt_path(options.index, info)  # where resolve_index looks, without its slow imports
    if cached is not None:
        report.ok.append(f"prebuilt index {options.index} is cached at {cached}")
    else:
        report.unchecked.append(f"prebuilt index {options.index} is not cached: the bm25 step downloads it "
                                f"({int(info['size compressed (bytes)']) / 1e9:.1f} GB compressed)")
    return int(info["documents"])


def _sidecar_upper_bound(name: str, options: argparse.Namespace, num_docs: int) -> int | None:
    """Bytes of a model's stored vectors if every passage filled its token cap (the recipe's doc_max_length)."""
    from pyserini_mores._cli import parse_model_args

    settings = _recipe_settings(recipe_for(name, options))
    model_args = {**settings.get("model_args", {}), **parse_model_args(list(MODELS[name].train_args))}
    cap = model_args.get("doc_max_length")
    reranker = MODELS[name].reranker
    if reranker == "mores":
        blocks = model_args.get("n_interaction_blocks", 2)
        width = BERT_BASE_HIDDEN * (1 if options.mores_reuse == "s1" else 2 * blocks)
    elif reranker == "prettr":
        width = model_args.get("compression_dim") or BERT_BASE_HIDDEN
    elif reranker == "tk":
        width = GLOVE_DIM
    else:
        return None
    return None if cap is None else num_docs * cap * width * STORE_DTYPE_BYTES


def _check_disk(options: argparse.Namespace, steps: list[str], num_docs: int | None,
                report: CheckReport) -> None:
    out = Path(options.output_dir)
    needs: list[tuple[Path, int, str]] = []
    if "download" in steps and options.triples is None:
        needs.append((out, TRIPLES_ARCHIVE_BYTES + TRIPLES_TSV_BYTES, "triples archive + unpacked"))
    if "sidecar" in steps and num_docs:
        for name in stored_models(options):
            size = _sidecar_upper_bound(name, options, num_docs)
            if size is not None and not (Layout(out).sidecar(name) / SIDECAR_MARKER).exists():
                needs.append((out, size, f"sidecar {name}"))
    if not needs:
        return
    by_device: dict[int, list] = {}
    for location, size, what in needs:
        existing = _nearest_existing(location)
        by_device.setdefault(existing.stat().st_dev, [existing, 0, []])
        by_device[existing.stat().st_dev][1] += size
        by_device[existing.stat().st_dev][2].append(f"{what} {_size(size)}")
    for existing, total, parts in by_device.values():
        free = shutil.disk_usage(existing).free
        message = (f"disk: up to {_size(total)} needed under {existing}, {_size(free)} free ({'; '.join(parts)}; "
                   "sidecars counted at every passage's token cap in float16 - real passages "
                   "need roughly half; GloVe, checkpoints and a prebuilt index's download are not counted)")
        (report.warnings if total > free else report.ok).append(message)


def _size(num_bytes: float) -> str:
    return f"{num_bytes / 1e12:.2f} TB" if num_bytes >= 1e12 else f"{num_bytes / 1e9:.1f} GB"


def _check_hardware(steps: list[str], report: CheckReport) -> None:
    try:
        import torch
    except ImportError as error:
        report.errors.append(f"PyTorch cannot be imported: {error}")
        return
    if "train" in steps:
        if torch.cuda.is_available():
            report.ok.append(f"CUDA GPU for training: {torch.cuda.get_device_name(0)}")
        else:
            report.warnings.append(
                f"no CUDA GPU visible to torch {torch.__version__} (CUDA build: {torch.version.cuda or 'none'}): the "
                "MS MARCO recipes are sized for a GPU (MORES: 15,625 steps of 128 BERT-base pairs)")
    if {"sidecar", "rerank"} & set(steps) and not torch.cuda.is_available():
        # `sidecar build` and `search` run with --device auto: on the GPU where torch sees one, else on the CPU
        report.warnings.append(
            "no CUDA GPU for `sidecar build` and `search`: on the CPU, encoding every passage (8.8M in MS MARCO) and "
            "reranking 1000 candidates per query with BERT-base-sized models takes days "
            "(MORES Table 4: the BERT ranker needs 161 s per query on 8 Xeon cores, MORES 2xIB S1 8 s)")


def _check_backbones(options: argparse.Namespace, report: CheckReport) -> None:
    """Hub backbones of the recipes: cached, or downloaded on first use."""
    inits = {str(_recipe_settings(recipe_for(name, options)).get("init")) for name in options.models
             if not MODELS[name].glove and not MODELS[name].compressor}
    if any(MODELS[name].compressor for name in options.models):
        inits.add(str(_recipe_settings(options.compressor_recipe).get("init")))
    for init in sorted(inits - {"None"}):
        if Path(init).exists() or init == "minilm":
            report.ok.append(f"backbone {init} is local")
            continue
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = isinstance(try_to_load_from_cache(init, "config.json"), str)
        except Exception:  # an invalid repo id, an old huggingface_hub: treat as not cached
            cached = False
        if cached:
            report.ok.append(f"backbone {init} is in the Hugging Face cache")
        else:
            report.unchecked.append(f"backbone {init} is not cached: training downloads it from the Hugging Face Hub")


# ---- running -------------------------------------------------------------------------------------------------------

def done(runner: StepRunner, command: Command) -> bool:
    return not command.always and runner.finished(command.name, command.outputs, command.inputs)


def print_plan(commands: list[Command], steps: list[str], runner: StepRunner) -> None:
    for step in steps:
        selected = [command for command in commands if command.step == step]
        if not selected:
            continue
        print(f"\n[{step}] {STEP_TITLES[step]}")
        for command in selected:
            note = f"    # done ({command.name}), skipped" if done(runner, command) else ""
            print(f"  $ {command.display()}{note}")


def execute(commands: list[Command], steps: list[str], runner: StepRunner) -> int:
    for command in commands:
        if command.step not in steps:
            continue
        try:
            runner.run(command.name, command.executable(), display=command.display(), outputs=command.outputs,
                       inputs=command.inputs, always=command.always)
        except StepFailed as failure:
            if command.step == "compare":
                print("some numbers are outside the tolerance (see the table above)", file=sys.stderr)
            else:
                print(f"error: step {command.step} failed (exit code {failure.returncode}) in the command above; fix "
                      "the cause and run the same command line again: finished commands are skipped", file=sys.stderr)
            return failure.returncode
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python integrations/msmarco_passage/reproduce.py",
        description="Reproduce the MORES/EARL, PreTTR and TK MS MARCO passage experiments (GPU + network). Other "
                    "forms: `compare --results-dir DIR`, `fetch-topics NAME OUTPUT`, `fetch-qrels NAME OUTPUT`, "
                    "`download URL --output PATH [--member NAME]`.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--output-dir", required=True, help="where data, models, sidecars, runs and results go")
    parser.add_argument("--dry-run", action="store_true", help="print every command and check what can be checked "
                                                               "offline; run nothing")
    parser.add_argument("--triples", help="triples.train.small.tsv (default: downloaded from the official URL)")
    parser.add_argument("--glove", help=f"{GLOVE_MEMBER} for TK (default: downloaded from {GLOVE_URL})")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(DEFAULT_MODELS), metavar="MODEL",
                        help=f"models to train and evaluate: {', '.join(MODELS)} (default: all but earl-avepool)")
    parser.add_argument("--topic-sets", nargs="+", choices=list(TOPIC_SETS), default=list(TOPIC_SETS),
                        metavar="SET", help="dev (msmarco-passage-dev-subset), dl19 (dl19-passage), dl20 "
                                            "(default: all)")
    parser.add_argument("--recipe", action="append", default=[], metavar="MODEL=RECIPE",
                        help="train MODEL with another recipe (a shipped name or a JSON file); repeatable")
    parser.add_argument("--compressor-recipe", default=COMPRESSOR_RECIPE, help="PreTTR compressor pre-training "
                                                                               "recipe (default: %(default)s)")
    parser.add_argument("--index", default=INDEX, help="Pyserini prebuilt index name or a Lucene index directory "
                                                       "with stored passage text (default: %(default)s)")
    parser.add_argument("--mores-reuse", choices=["s1", "s2"], default="s1",
                        help="what MORES sidecars store; the scores are identical, S1 is 1/(2K) of S2's size "
                             "(default: s1)")
    parser.add_argument("--rerank-depth", type=int, default=1000, help="BM25 candidates reranked (default 1000)")
    parser.add_argument("--threads", type=int, default=1, help="BM25 threads")
    parser.add_argument("--device", help="training device (default: cuda when available)")
    parser.add_argument("--early-stopping-topics", metavar="TSV",
                        help="queries for the dev evaluation of recipes that stop early (PreTTR, TK); default: the "
                             "dev subset (the recipes use its first 200 / 2,000 queries)")
    parser.add_argument("--early-stopping-qrels", metavar="QRELS", help="qrels of --early-stopping-topics")
    parser.add_argument("--tolerance", action="append", default=[], metavar="[METRIC=]VALUE",
                        help="comparison tolerance (default 0.01 for every metric); repeatable")
    selection = parser.add_mutually_exclusive_group()
    selection.add_argument("--from", dest="from_step", choices=STEPS, metavar="STEP", help="start at this step")
    selection.add_argument("--only", nargs="+", choices=STEPS, metavar="STEP", help=f"run only these steps: "
                                                                                     f"{', '.join(STEPS)}")
    return parser


def parse_options(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    options = parser.parse_args(argv)
    options.recipes = {}
    for item in options.recipe:
        name, sep, recipe = item.partition("=")
        if not sep or name not in MODELS or not recipe:
            parser.error(f"--recipe expects MODEL=RECIPE with MODEL one of {', '.join(MODELS)}; got '{item}'")
        options.recipes[name] = recipe
    if (options.early_stopping_topics is None) != (options.early_stopping_qrels is None):
        parser.error("--early-stopping-topics and --early-stopping-qrels go together")
    options.models = list(dict.fromkeys(options.models))
    return options


def run_pipeline(options: argparse.Namespace) -> int:
    commands = build_plan(options)
    steps = selected_steps(options)
    runner = StepRunner(Path(options.output_dir) / JOURNAL, dry_run=options.dry_run)
    print(f"MS MARCO passage reproduction{' plan (dry run)' if options.dry_run else ''} in {options.output_dir}: "
          f"models {', '.join(options.models)}; topic sets {', '.join(options.topic_sets)}; steps {', '.join(steps)}")
    print_plan(commands, steps, runner)
    report = check_plan(options, commands, steps, runner)
    report.print()
    if report.errors:
        print(f"\n{len(report.errors)} problem(s) found (ERROR above); nothing was run.", file=sys.stderr)
        return 1
    if options.dry_run:
        pending = sum(1 for command in commands if command.step in steps and not done(runner, command))
        print(f"\nDry run OK: {pending} command(s) to run"
              + (f"; {len(report.unchecked)} input(s) need the network and could not be checked offline (listed "
                 "above)" if report.unchecked else "") + ".")
        return 0
    print()
    Path(options.output_dir).mkdir(parents=True, exist_ok=True)
    return execute(commands, steps, runner)


# ---- helpers the pipeline calls -------------------------------------------------------------------------------------

def build_helper_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python integrations/msmarco_passage/reproduce.py")
    helpers = parser.add_subparsers(dest="helper", required=True)
    topics = helpers.add_parser("fetch-topics", help="write a Pyserini topics set as a qid<TAB>text TSV")
    topics.add_argument("name")
    topics.add_argument("output")
    qrels = helpers.add_parser("fetch-qrels", help="copy a Pyserini qrels set to a file")
    qrels.add_argument("name")
    qrels.add_argument("output")
    download = helpers.add_parser("download", help="download a file (resuming a partial one), optionally "
                                                   "extracting one member of a .tar.gz or .zip")
    download.add_argument("url")
    download.add_argument("--output", required=True, help="the file to produce")
    download.add_argument("--member", help="extract this file of the archive (matched by name)")
    return parser


def run_helper(argv: list[str]) -> int:
    args = build_helper_parser().parse_args(argv)
    try:
        if args.helper == "fetch-topics":
            fetch_topics(args.name, args.output)
        elif args.helper == "fetch-qrels":
            fetch_qrels(args.name, args.output)
        else:
            download(args.url, args.output, args.member)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def fetch_topics(name: str, output: str | Path) -> None:
    from pyserini_mores.formats import atomic_writer
    from pyserini_mores.search.__main__ import load_topics

    topics = load_topics(name)
    with atomic_writer(output) as stream:
        for qid, text in topics.items():
            stream.write(f"{qid}\t{' '.join(text.split())}\n")
    print(f"wrote {len(topics)} topics of {name} to {output}")


def fetch_qrels(name: str, output: str | Path) -> None:
    from pyserini_mores._io import copy_file_atomic
    from pyserini_mores._jvm import import_pyserini

    try:
        source = import_pyserini("pyserini.search").get_qrels_file(name)
    except Exception as error:  # Java IOExceptions when the download fails
        raise OSError(f"Pyserini could not provide qrels '{name}': {str(error).splitlines()[0]}") from error
    copy_file_atomic(source, output)
    print(f"copied qrels {name} ({source}) to {output}")


def download(url: str, output: str | Path, member: str | None = None) -> Path:
    """Download ``url`` (resuming a partial download), then extract ``member`` of the archive to ``output``.

    Files appear only when complete: the download grows in ``<archive>.part`` and the extracted member in
    ``<output>.part``, each renamed when finished. Without ``member`` the download itself is ``output``.
    """
    import urllib.request

    from tqdm import tqdm

    output = Path(output)
    archive = output.with_name(url.rstrip("/").rsplit("/", 1)[-1]) if member else output
    archive.parent.mkdir(parents=True, exist_ok=True)
    if not archive.exists():
        partial = archive.with_name(archive.name + ".part")
        start = partial.stat().st_size if partial.exists() else 0
        request = urllib.request.Request(url, headers={"Range": f"bytes={start}-"} if start else {})
        with urllib.request.urlopen(request) as response:
            if start and getattr(response, "status", None) != 206:
                start = 0  # the server ignored the range: start over
            length = response.headers.get("Content-Length")
            total = start + int(length) if length else None
            with open(partial, "ab" if start else "wb") as sink, \
                    tqdm(total=total, initial=start, unit="B", unit_scale=True, desc=archive.name) as bar:
                while chunk := response.read(1 << 20):
                    sink.write(chunk)
                    bar.update(len(chunk))
        os.replace(partial, archive)
    if member:
        extract_member(archive, member, output)
    print(f"{output} is ready")
    return output


def extract_member(archive: Path, member: str, output: Path) -> None:
    """Stream the archive member whose file name is ``member`` to ``output`` (``.tar.gz``/``.tgz`` or ``.zip``)."""
    import tarfile
    import zipfile

    partial = output.with_name(output.name + ".part")
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as bundle:
            names = [name for name in bundle.namelist() if Path(name).name == member]
            if not names:
                raise ValueError(f"{archive} has no member {member}")
            with bundle.open(names[0]) as source, open(partial, "wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
    else:
        with tarfile.open(archive, "r|*") as bundle:  # streaming: one pass, no index of a 27 GB archive
            for entry in bundle:
                if entry.isfile() and Path(entry.name).name == member:
                    with bundle.extractfile(entry) as source, open(partial, "wb") as sink:
                        shutil.copyfileobj(source, sink, 1 << 20)
                    break
            else:
                raise ValueError(f"{archive} has no member {member}")
    os.replace(partial, output)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("fetch-topics", "fetch-qrels", "download"):
        return run_helper(argv)
    if argv and argv[0] == "compare":
        return comparison.main(argv[1:])
    return run_pipeline(parse_options(argv))


if __name__ == "__main__":
    sys.exit(main())
