"""docs/configuration.md: the service's VLFLEET_* settings (service/runtime/settings.py FIELDS) and every role's inputs
(roles/*/meta/argument_specs.yml)."""

from __future__ import annotations

from pathlib import Path

import yaml

from ops.docs.markdown import HEADER, cell, default


def service_settings() -> str:
    from service.runtime.settings import FIELDS

    lines = ["## Service settings (`VLFLEET_*`)", "",
             "The service reads these environment variables once at start and refuses to start, naming the variable, "
             "when a value is not valid, and when a `VLFLEET_*` name is none of these nor the launcher's "
             "`VLFLEET_CPUS` and `VLFLEET_CPU_PLAN_FILE` ([roles.md](roles.md#the-launcher-servicelauncherpy)), "
             "naming the nearest valid one: a misspelt setting is an error, not a setting silently ignored (the host "
             "program's env step refuses it before the env file is written). On hosts the role `vlm_service` writes "
             "them to "
             "`/opt/vlfleet/current/vlfleet.env` (add your own with `vlm_service_extra_env`); `vlfleet serve` takes "
             "the common ones as flags.", "",
             "| Variable | Default | Accepts | What it does |", "|---|---|---|---|"]
    for f in FIELDS:
        lines.append(f"| `{f.env}` | {default(f.default)} | {cell(f.accepts)} | {cell(f.help)} |")
    return "\n".join(lines) + "\n"


def _role_section(role_dir: Path) -> str:
    spec = yaml.safe_load((role_dir / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    out = []
    for entry, body in spec.items():
        title = role_dir.name if entry == "main" else f"{role_dir.name} (entry point `{entry}`)"
        out += [f"### {title}", "", cell(body.get("short_description", "")), ""]
        for para in body.get("description", []) or []:
            out += [cell(para), ""]
        options = body.get("options") or {}
        if not options:
            out += ["No inputs.", ""]
            continue
        out += ["| Variable | Type | Default | What it does |", "|---|---|---|---|"]
        for name, opt in options.items():
            kind = opt.get("type", "str")
            if kind == "list" and opt.get("elements"):
                kind = f"list of {opt['elements']}"
            shown = "**required**" if opt.get("required") else default(opt.get("default"))
            desc = opt.get("description", "")
            desc = " ".join(desc) if isinstance(desc, list) else desc
            if opt.get("choices"):
                desc += " Choices: " + ", ".join(f"`{c}`" if c != "" else '`""`' for c in opt["choices"]) + "."
            out.append(f"| `{name}` | {kind} | {shown} | {cell(desc)} |")
        out.append("")
    return "\n".join(out)


def render(root: Path) -> str:
    roles = sorted(p.parent.parent for p in (root / "roles").glob("*/meta/argument_specs.yml"))
    parts = [HEADER.format(source="service/runtime/settings.py (FIELDS) and roles/*/meta/argument_specs.yml"),
             "# Configuration reference", "",
             "Two layers: the **service** on each host reads `VLFLEET_*` environment variables; the **roles** read "
             "Ansible variables from your inventory (`inventory.example` shows the common ones with their defaults). "
             "What each role does, and in which order site.yml runs them: [roles.md](roles.md).", "",
             "Contents: [service settings](#service-settings-vlfleet_) · roles: "
             + " · ".join(f"[{r.name}](#{r.name})" for r in roles), "",
             service_settings(), "## Role variables", "",
             "Every role validates its inputs against `meta/argument_specs.yml` before it runs, so a wrong type or "
             "a missing required variable stops the play with the variable's name. *Advanced* marks knobs few "
             "fleets need.", ""]
    parts += [_role_section(r) for r in roles]
    return "\n".join(parts).rstrip() + "\n"
