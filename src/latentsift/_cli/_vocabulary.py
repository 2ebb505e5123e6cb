"""The command line's vocabulary: one meaning per option name, and the old names kept as hidden aliases.

``MEANINGS`` gives each option name (and each positional argument, by its metavar) its one meaning in
every command that takes it; ``tests/test_vocabulary.py`` walks every command's parameters, checks that
each name is declared here with one type, and that ``docs/cli-vocabulary.md`` holds ``markdown_tables``.
``ALIASES`` maps an old name of one command to its new one: ``advise`` rewrites the command line
before it is parsed and prints one line of advice per old name used, so old scripts keep working.
"""
from __future__ import annotations

import re
from typing import Callable, Iterator

from .._core.errors import LatentSiftError

#: name -> its one meaning (the commands that take it are read from the commands themselves).
MEANINGS: dict[str, str] = {
    "POOLS": "canonical JSONL of candidate pools (one trajectory per line): the command's input",
    "INPUT": "a trajectory file, folder or archive to import",
    "TASKS": "task file of the rollouts (HumanEval JSONL)",
    "BANK_DIR": "the bank folder a scorer is trained on",
    "FILTER_JSON": "the JSON written by 'filter'",
    "NAME": "a pinned policy's name",
    "MODEL": "a model file to check against a pin",
    "--ablations": "JSON of the ablation tables",
    "--accumulation": "trajectories per optimizer step",
    "--agent-transfer": "also train on one agent's trajectories only",
    "--api-key-env": "environment variable holding the API key",
    "--api-model": "model name sent to the endpoint",
    "--approx": "approximate nearest-neighbour search (ivf or hnsw)",
    "--backend": "a registered backend of the command's component (extraction, verifier, nearest-neighbour search)",
    "--bank": "a bank folder from 'bank build'",
    "--bank-choice": "all-agent bank or the nearest per-agent sub-bank",
    "--bank-shards": "bank shards on Ray",
    "--base-url": "endpoint root of an OpenAI-compatible server",
    "--bootstrap": "bootstrap resamples of instances for the intervals",
    "--cache": "cache folder",
    "--calibration": "labelled pools JSONL the keep rule is fitted on",
    "--calibration-epochs": "scorer epochs per cross-fitted calibration half",
    "--calibration-method": "score -> P(resolved) map",
    "--calibration-states": "states of the calibration candidates",
    "--center": "centre the bank's states (none or mean)",
    "--channels": "channels used, comma-separated (cot, obs, fn)",
    "--chunk-tokens": "prefill chunk size",
    "--concurrency": "parallel remote calls",
    "--confidence": "the keep rule's high-probability mode, 1 - delta",
    "--cost": "what the keep rule saves",
    "--data": "the SWE-bench Lite pools folder",
    "--device": "cpu or cuda",
    "--device-map": "split a large policy over devices",
    "--dist-instances": "instances sampled for the distribution figure",
    "--distance": "the distance branch's sign (two-sided, pos or neg)",
    "--distance-only": "score with the distance branch only",
    "--distributions": "score input whose distributions are plotted",
    "--draws": "seeded draws of K candidates per instance and K",
    "--dtype": "the model's dtype",
    "--evidence": "strongest steps reported per channel",
    "--exact": "enumerate all subsets when they are few",
    "--exclude-repos": "repositories left out, comma-separated",
    "--final-verifier": "the EF input used in Stage 4",
    "--folds": "number of disjoint folds",
    "--format": "input format of the importer",
    "--frac": "fraction of the pool the fixed keep rule retains",
    "--full": "every instance, whole spans (hours)",
    "--fusion-weight": "weight of the distance branch in the fused score",
    "--gen-test-key": "the trajectories' key of the generated-test score (Stage 3)",
    "--gpus-per-worker": "GPUs each Ray worker claims",
    "--group-by": "what the disjoint folds group by (repo, agent or instance)",
    "--guard-false-alarm": "the shift guard's stated false-alarm rate",
    "--guard-reference": "the shift guard's in-bank reference (repo or instance)",
    "--headline": "filters in the main table and figures",
    "--ids": "text file of traj_ids to process",
    "--include-leaky": "also use the leaky runs",
    "--init": "initialisation of the scorer",
    "--instance-ids": "only these instance ids, comma-separated",
    "--k": "pool size K: candidates drawn per instance (repeat)",
    "--keep-rule": "a registered keep rule",
    "--labels": "label files of the imported trajectories",
    "--layer": "index into the stored layers for distance states",
    "--layers": "layers stored by extraction",
    "--learned-only": "score with the learned branch only",
    "--lr": "learning rate",
    "--max-epochs": "most training epochs",
    "--max-instances": "at most N instances",
    "--max-keep": "keep at most B candidates per pool",
    "--max-new-tokens": "most tokens generated per turn",
    "--max-prompt-tokens": "tokens kept per context message",
    "--max-span-tokens": "tokens kept per cot/obs/fn span",
    "--max-tokens": "tokens kept per rendered trajectory",
    "--method": "a registered filter",
    "--min-keep": "fewest candidates kept per pool",
    "--missing": "what to do with missing Stage-2/3 values",
    "--model": "the policy or judge model (HF folder or .gguf)",
    "--n-unresolved": "unresolved-only instances added to the subset",
    "--name": "name of this verifier in the evaluation",
    "--names": "JSON of display names",
    "--no-filter": "also evaluate Stage 1 without a filter",
    "--normalize": "normalisation of the bank's states",
    "--on-leak": "what to do with a pool whose instance the bank holds",
    "--on-shift": "what to do with a pool unlike the bank's",
    "--operating-point": "a saved operating point",
    "--out": "where the command writes (never inside its inputs)",
    "--pack-tokens": "tokens per packed forward",
    "--renderer": "a registered span renderer",
    "--sandbox": "a registered sandbox that runs the candidates and tests",
    "--tasks-source": "a registered source of the rollout's tasks",
    "FOLDERS": "rollout folders whose trajectories are exported",
    "--patch-step-tokens": "tokens kept per span of the patch-writing step",
    "--patience": "epochs without improvement before stopping",
    "--per-agent": "also fit a bank and scorer per agent",
    "--per-step": "replay each step in its own context",
    "--pin": "the pin a model file is checked against",
    "--pools": "canonical JSONL of the pools a second input was made from",
    "--proxy-states": "states of the same candidates from another model",
    "--ray": "run on Ray: local, auto or HOST:PORT",
    "--reference": "the workflow that savings are measured against",
    "--repos": "only these repositories, comma-separated",
    "--retries": "retries per remote call",
    "--run": "run name in the trajectory ids",
    "--samples": "samples (rollouts) per task",
    "--scaffold": "the scaffold recorded for every trajectory",
    "--scorer": "a scorer folder from 'scorer train'",
    "--scorer-epochs": "epochs of the gated linear scorer",
    "--scores": "score folders or files of the filters and verifiers",
    "--seed": "the seed",
    "--shard": "I/N: this process's share of the tasks",
    "--shard-size": "trajectories per shard of the state store",
    "--show": "pools printed as tables",
    "--sifter": "a sifter folder from 'fit'",
    "--skip-bad": "skip records that cannot be imported",
    "--small-pools": "what to do with pools smaller than K",
    "--states": "a state store from 'extract' or 'rollout'",
    "--stop-when-single": "stop the cascade once one candidate is left",
    "--summary-json": "also write the import summary as JSON",
    "--sweep": "extra representations to extract and evaluate",
    "--sweep-patch-tokens": "tokens per patch-step span in the sweep",
    "--sweep-span-tokens": "span budget of the sweep",
    "--target-recall": "target pool recall of the recall-targeted keep rule",
    "--tasks": "only the first N tasks",
    "--temperature": "sampling temperature",
    "--testgen-tokens": "tokens charged per pool reaching Stage 3",
    "--threads": "torch CPU threads",
    "--tie": "tie rule after Stage 4",
    "--timeout": "seconds a call or program may run",
    "--top-p": "nucleus sampling mass",
    "--system-prompt": "the system message of every rollout sample",
    "--turns": "most turns per sample",
    "--val-frac": "validation fraction",
    "--variants": "also evaluate the beyond-paper variants",
    "--verifier": "EF verifier results for Stage 4",
    "--verifier-max-tokens": "the EF verifier's prompt budget (longer logs are condensed)",
    "--weight-decay": "AdamW weight decay",
    "--weighting": "step weights (linear or uniform)",
    "--workers": "workers run side by side",
}

#: (command, old name) -> new name; a new name of "" makes the value the command's first argument (POOLS).
ALIASES: dict[tuple[str, str], str] = {
    ("extract", "--instances"): "--max-instances",
    ("fit", "--instances"): "--max-instances",
    ("crossval", "--instances"): "--max-instances",
    ("filter", "--instances"): "--instance-ids",
    ("rollout run", "--k"): "--samples",
    ("crossval", "--boot"): "--bootstrap",
    ("premise", "--boot"): "--bootstrap",
    ("transfer", "--boot"): "--bootstrap",
    ("fit", "--false-alarm"): "--guard-false-alarm",
    ("fit", "--reference"): "--guard-reference",
    ("evaluate", "--pools"): "",
    ("verify", "--trajectories"): "",
    ("verify", "--max-prompt-tokens"): "--verifier-max-tokens",
}
#: command -> the new names its old ones stand for (a value given under both names must be one).
_TARGETS: dict[str, set[str]] = {c: {new for (c2, _), new in ALIASES.items() if c2 == c and new} for c, _ in ALIASES}
#: (command, option, old value) -> new value.
VALUE_ALIASES: dict[tuple[str, str, str], str] = {("fit", "--guard-reference", "repository"): "repo"}
#: old subcommand -> new one.
COMMAND_ALIASES: dict[tuple[str, str], str] = {("policy", "verify"): "check"}
#: command -> (old order of its inputs, new order): the command itself reads the old one (its ``--pools`` is hidden).
ORDER_ALIASES: dict[str, tuple[str, str]] = {"bank build": ("STATES_DIR --pools POOLS", "POOLS --states STATES_DIR")}


#: (owner, parameter) of a library check a command reaches -> the option that sets it: its refusal ("The 'layer'
#: parameter of Bank must be ...") is printed in the command line's words ("--layer must be ...").
PARAMETER_OPTIONS: dict[tuple[str, str], str] = {
    ("Bank", "layer"): "--layer", ("Bank", "channels"): "--channels", ("Bank", "normalize"): "--normalize",
    ("Bank", "center"): "--center", ("Bank", "backend"): "--backend",
    ("select_by_repo", "include"): "--repos", ("select_by_repo", "exclude"): "--exclude-repos",
    ("LinearScorer", "lr"): "--lr", ("LinearScorer", "weight_decay"): "--weight-decay",
    ("LinearScorer", "accumulation"): "--accumulation", ("LinearScorer", "max_epochs"): "--max-epochs",
    ("LinearScorer", "init"): "--init", ("LinearScorer", "patience"): "--patience",
    ("import_paths", "scaffold"): "--scaffold", ("EFVerifier", "max_prompt_tokens"): "--verifier-max-tokens",
    ("reproduce", "sweep"): "--sweep", ("evaluate_run", "final_verifier"): "--final-verifier",
}
_PARAMETER = re.compile(r"The '(\w+)' parameter of (\w+)[\w.]* ")


def in_option_words(message: str) -> str:
    """``message`` with a library parameter that an option sets (:data:`PARAMETER_OPTIONS`) named as that option."""
    m = _PARAMETER.match(message)
    option = PARAMETER_OPTIONS.get((m[2], m[1])) if m else None
    return f"{option} {message[m.end():]}" if option else message


def order_advice(command: str) -> str:
    """The advice line for a command given its inputs in the old order."""
    old, new = ORDER_ALIASES[command]
    return f"'{command} {old}' is now '{command} {new}'; it works for now."


def advise(args: list[str], say: Callable[[str], None]) -> list[str]:
    """``args`` (a command line after ``latentsift``) with old names replaced by new ones; ``say`` gets one
    line of advice per old name used."""
    args = list(args)
    if len(args) >= 2 and tuple(args[:2]) in COMMAND_ALIASES:
        new = COMMAND_ALIASES[tuple(args[:2])]
        say(f"'{args[0]} {args[1]}' is now '{args[0]} {new}'; it works for now.")
        args[1] = new
    command = command_path(args)
    _check_one_spelling(command, args)
    return list(_renamed(command, args, say))


def _check_one_spelling(command: str, args: list[str]) -> None:
    """Refuse an old name given beside its new one with another value (``rollout --samples 0 --k 2`` would run
    the last one given): one line naming both."""
    given: dict[str, list[tuple[str, str]]] = {}   # option as given -> [(its new name, value)]
    for i, a in enumerate(args):
        if a == "--":
            break
        name, eq, value = a.partition("=")
        if not name.startswith("--"):
            continue
        new = ALIASES.get((command, name)) or (name if name in _TARGETS.get(command, ()) else None)
        if new:
            given.setdefault(new, []).append((name, value if eq else (args[i + 1] if i + 1 < len(args) else "")))
    for new, uses in given.items():
        if len({name for name, _ in uses}) > 1 and len({value for _, value in uses}) > 1:
            said = " and ".join(f"{name} {value}" for name, value in uses)
            old = next(name for name, _ in uses if name != new)
            raise LatentSiftError(f"{old} is the old name of {new} in {command}; give one of them, not both with "
                                  f"other values ({said}).")


def command_path(args: list[str]) -> str:
    """The command a command line runs: 'fit', 'bank build', or 'rollout run' for 'rollout [TASKS] --out ...'
    (rollout's default subcommand)."""
    if len(args) >= 2 and args[0] in ("bank", "scorer", "policy"):
        return " ".join(args[:2])
    if args and args[0] == "rollout":
        return "rollout export" if args[1:2] == ["export"] else "rollout run"
    return args[0] if args else ""


def _renamed(command: str, args: list[str], say: Callable[[str], None]) -> Iterator[str]:
    said: set[str] = set()
    pending = None   # the option whose value comes next
    for i, a in enumerate(args):
        if a == "--":          # the rest is positional
            yield from args[i:]
            return
        name, eq, value = a.partition("=")
        new = ALIASES.get((command, name))
        if new is not None and a.startswith("--"):
            if name not in said:
                said.add(name)
                say(f"{name} is now {new or 'the first argument (POOLS)'} in {command}; it works for now.")
            if not new:        # the value becomes the positional argument
                if eq:
                    yield value
                continue
            name, a = new, new + eq + value
        if pending is not None:
            a, pending = _value(command, pending, a, say), None
        elif eq:
            a = f"{name}={_value(command, name, value, say)}"
        elif a.startswith("--"):
            pending = a
        yield a


def _value(command: str, option: str, value: str, say: Callable[[str], None]) -> str:
    """``value`` of ``option``, or its new spelling (with a line of advice)."""
    new = VALUE_ALIASES.get((command, option, value))
    if new is None:
        return value
    say(f"{option} {value} is now {option} {new} in {command}; it works for now.")
    return new


def parameters(root) -> Iterator[tuple[str, object]]:
    """(command path, click parameter) of every visible parameter of every command under ``root``."""
    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs is not None:
            for n, c in subs.items():
                if not getattr(c, "hidden", False):
                    yield from walk(c, path + [n])
        else:
            for p in cmd.params:
                if not getattr(p, "hidden", False) and p.name != "help":
                    yield " ".join(path), p
    yield from walk(root, [])


def name_of(param) -> str:
    """The vocabulary's name of a parameter: an option's first flag, an argument's metavar."""
    if param.param_type_name == "option":
        return param.opts[0]
    return (param.metavar or param.name).upper()


def markdown_tables(root) -> tuple[str, str]:
    """The vocabulary as markdown tables: (name, meaning, the commands that take it), (old name, command, now)."""
    commands: dict[str, list[str]] = {}
    for path, p in parameters(root):
        commands.setdefault(name_of(p), []).append(path)
    rows = ["| name | meaning | commands |", "|---|---|---|"]
    for name in sorted(commands, key=lambda n: (n.startswith("--"), n)):
        shown = f"`{name}`" if name.startswith("--") else name
        rows.append(f"| {shown} | {MEANINGS.get(name, '(undeclared)')} | {', '.join(commands[name])} |")
    olds = [f"| `{old}` | {command} | " + (f"`{new}`" if new else "the first argument (POOLS)") + " |"
            for (command, old), new in ALIASES.items()]
    olds += [f"| `{o} {v}` | {c} | `{o} {n}` |" for (c, o, v), n in VALUE_ALIASES.items()]
    olds += [f"| `{c} {o}` | {c} | `{c} {n}` |" for (c, o), n in COMMAND_ALIASES.items()]
    olds += [f"| `{c} {o}` | {c} | `{c} {n}` |" for c, (o, n) in ORDER_ALIASES.items()]
    return "\n".join(rows) + "\n", "\n".join(["| old name | command | now |", "|---|---|---|"] + olds) + "\n"
