"""R2E-Gym / DeepSWE ``Trajectory`` records (one JSON object per JSONL line).

Schema followed: ``TrajectoryStep`` / ``Trajectory`` of ``agentica-project/R2E-Gym``
(``src/r2egym/agenthub/trajectory/trajectory.py``) and the message format of its ``Agent.run``
without function calling: assistant ``f"{thought}\\n\\n{action.to_xml_string()}"``, observation sent
back as a ``user`` message. AutoCodeRover runs converted to this schema (``agent_args.scaffold ==
"AutoCodeRover"``) carry their real opening messages in ``agent_args.initial_messages`` and split
observations (``info.obs_msg_chars``); both are honoured.
"""
from __future__ import annotations

from typing import Any

from .._core import words
from .trajectory import Step, Trajectory
from ._common import Where, repo_from_instance
from ._registry import register_importer
from ._sources import Source

NO_CALL = "<function=>\n</function>"  # R2E-Gym's Action("", {}).to_xml_string()
ACR_SCAFFOLD = "acr"
# agent_args.scaffold -> the agent name used in candidates.csv (this agent is also the shift guard's scaffold)
SCAFFOLD_NAMES = {"autocoderover": "acr", "acr": "acr", "swe-agent": words.SWEAGENT, words.SWEAGENT: words.SWEAGENT,
                  "r2e-gym": words.R2EGYM, words.R2EGYM: words.R2EGYM, words.OPENHANDS: words.OPENHANDS,
                  "mini-swe-agent": words.MINISWEAGENT, words.MINISWEAGENT: words.MINISWEAGENT}  # agent names


def looks_like(record: Any) -> bool:
    return isinstance(record, dict) and "trajectory_steps" in record and "problem_statement" in record


def agent_name(scaffold: str) -> str:
    return SCAFFOLD_NAMES.get(scaffold.strip().lower(), scaffold.strip().lower())


@register_importer(words.R2EGYM, detect=looks_like, missing=("trajectory_steps", "is missing (not an R2E-Gym trajectory)"),
                   describe="an R2E-Gym", priority=10)
def read(record: dict, where: Where, src: Source) -> Trajectory:
    """One R2E-Gym record; run = ``exp_name``, else the file name; agent = ``agent_args.scaffold``."""
    return parse(record, where, default_run=src.basename.rsplit(".jsonl", 1)[0].rsplit(".json", 1)[0])


def parse(record: dict, where: Where, *, default_run: str) -> Trajectory:
    g = where.get
    steps_in = g(record, "trajectory_steps", list)
    problem = g(record, "problem_statement", str)
    ds = g(record, "ds", dict, optional=True, default={})
    agent_args = g(record, "agent_args", dict, optional=True, default={})
    docker_image = g(record, "docker_image", str, optional=True, default="")
    instance_id = g(ds, "instance_id", str, prefix="ds.", optional=True, default="") or \
        (docker_image.rsplit(".", 1)[-1] if docker_image else "")
    if not instance_id:
        raise where.error("ds.instance_id", "is missing and docker_image gives no instance id")
    run = g(record, "exp_name", str, optional=True, default="") or default_run
    reward = g(record, "reward", (int, float), optional=True)
    scaffold = g(agent_args, "scaffold", str, prefix="agent_args.", optional=True, default="")
    agent = agent_name(scaffold) if scaffold else words.R2EGYM
    is_acr = agent == ACR_SCAFFOLD

    context: list[dict[str, Any]] = []
    system_prompt = None
    sep = "\n\n"
    if is_acr:
        init = g(agent_args, "initial_messages", list, prefix="agent_args.")
        for i, m in enumerate(init):
            role = g(m, "role", str, prefix=f"agent_args.initial_messages[{i}].")
            content = g(m, "content", str, prefix=f"agent_args.initial_messages[{i}].")
            context.append({"role": role, "content": content})
        if context and context[0]["role"] == "system":
            system_prompt = context[0]["content"]
        sep = g(agent_args, "observation_separator", str, prefix="agent_args.", optional=True, default="\n\n")
    else:
        sp = agent_args.get("system_prompt")
        if isinstance(sp, str):
            system_prompt = sp
            context = _r2egym_context(sp, agent_args.get("instance_prompt"), problem)

    max_steps = record.get("max_steps") if isinstance(record.get("max_steps"), int) else 0
    steps = [_step(s, i, where, is_acr=is_acr, sep=sep, max_steps=max_steps) for i, s in enumerate(steps_in)]
    if not is_acr and context and max_steps > 0:
        # R2E-Gym appends the step budget to the last user message before every query.
        context[-1] = dict(context[-1], content=context[-1]["content"] + _budget(max_steps))

    meta: dict[str, Any] = {"exit_reason": record.get("exit_reason"), "docker_image": docker_image}
    for k in ("model", "evaluated_attempt", "result_category", "source_folder"):
        if k in agent_args:
            meta[k] = agent_args[k]
    if is_acr and "write_patch_system_prompt" in agent_args:
        meta["write_patch_system_prompt"] = agent_args["write_patch_system_prompt"]
    for k in ("base_commit", "version"):
        if k in ds:
            meta[k] = ds[k]
    return Trajectory(
        traj_id=f"{run}/{instance_id}", instance_id=instance_id,
        repo=g(ds, "repo", str, prefix="ds.", optional=True, default="") or repo_from_instance(instance_id),
        task_prompt=problem, steps=steps,
        patch=g(record, "output_patch", str, optional=True, default=""),
        reward=None if reward is None else float(reward), system_prompt=system_prompt,
        agent=agent, run=run, source_format=words.R2EGYM, source_id=f"{where.source}:{where.line}",
        meta=meta, context=context)


def _budget(remaining: int) -> str:
    if remaining > 0:
        return f"\nSteps Remaining: {remaining}"
    return "\nYou have reached the maximum number of steps. Please submit your answer NOW."


def _r2egym_context(system_prompt: str, instance_prompt: Any, problem: str) -> list[dict[str, Any]]:
    """R2E-Gym's opening messages: the system prompt and the instance prompt with the issue."""
    user = problem
    if isinstance(instance_prompt, str) and "{problem_statement}" in instance_prompt:
        user = instance_prompt.replace("{problem_statement}", problem).replace("{working_dir}", "/testbed")
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": user}]


def _step(s: Any, i: int, where: Where, *, is_acr: bool, sep: str, max_steps: int) -> Step:
    p = f"trajectory_steps[{i}]."
    thought = where.get(s, "thought", str, prefix=p)
    action = where.get(s, "action", str, prefix=p)
    obs = where.get(s, "observation", str, prefix=p)
    info = where.get(s, "info", dict, prefix=p, optional=True, default={})
    fn = "" if action == NO_CALL else action
    parts: list[list] = []
    if thought:
        parts.append(["cot", len(thought)])
    if is_acr:
        # ACR wrote its calls in prose; the converted action is rendered after the thought.
        if fn:
            parts += ([["markup", "\n\n"]] if thought else []) + [["fn", len(fn)]]
    else:
        parts.append(["markup", "\n\n"])
        parts.append(["fn", len(fn)] if fn else ["markup", action])
    layout: list[dict[str, Any]] = [{"role": "assistant", "parts": parts}]
    lengths = info.get("obs_msg_chars") if is_acr else None
    if lengths is not None:
        if not (isinstance(lengths, list) and lengths and all(isinstance(n, int) and n >= 0 for n in lengths)):
            raise where.error(f"{p}info.obs_msg_chars", "must be a non-empty list of non-negative integers")
        if sum(lengths) + len(sep) * (len(lengths) - 1) != len(obs):
            raise where.error(f"{p}info.obs_msg_chars",
                              f"parts ({sum(lengths)} chars + separators) do not add up to the "
                              f"observation ({len(obs)} chars)")
        pos = 0
        for k, n in enumerate(lengths):
            skip: list[list] = []
            if k:  # the separator joining two user messages is not part of either message
                if obs[pos:pos + len(sep)] != sep:
                    raise where.error(f"{p}info.obs_msg_chars", f"part {k} is not preceded by the separator")
                skip = [["skip", "obs", len(sep)]]
                pos += len(sep)
            layout.append({"role": "user", "parts": skip + [["obs", n]]})
            pos += n
    else:
        obs_parts: list[list] = [["obs", len(obs)]] if obs else []
        if not is_acr and max_steps > 0:
            obs_parts.append(["markup", _budget(max_steps - (i + 1))])
        if obs_parts:
            layout.append({"role": "user", "parts": obs_parts})
    meta = dict(info)
    if "done" in s:
        meta["done"] = s["done"]
    return Step(cot=thought, fn=fn, obs=obs, fn_style="text", obs_role="user", meta=meta, layout=layout)

