"""Descriptor: an origin's NIP-PL push settings (push kinds, urgent kinds, h_grammar, class support,
every limitation value, app profiles), checked against every descriptor rule before saving (the
failing rule is named), with a live preview of the NIP-11 `push` object."""

from __future__ import annotations

import json
import time

from starlette.requests import Request
from starlette.routing import Route

from appliance.commands.origins import find, owned_fields, set_push
from appliance.errors import ConfigError
from appliance.origins import load_origins
from appliance.push.config import build_descriptor, check_push_config, check_push_fits_relay
from appliance.push.descriptor import CLASS_REGISTRY, H_GRAMMARS, TRANSPORTS, ExecutorKey, Limits, \
    descriptor_to_json

# A stand-in key for previews of an origin whose first key is generated when push is saved on.
PREVIEW_KEY = ExecutorKey("generated-on-save", "79be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798",
                          current=True)


def _kinds(text: str, field: str) -> list[int]:
    out = []
    for item in text.replace(",", " ").split():
        try:
            out.append(int(item))
        except ValueError:
            raise ConfigError(field, text, "expected kind numbers separated by commas") from None
    return out


def _as_list(value) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def push_from_form(form: dict, current: dict) -> dict:
    """The push table an edit form describes ({} when push is switched off)."""
    if form.get("push_enabled") != "on":
        return {}
    push: dict = {}
    # App profiles: the existing rows (extra keys such as credentials kept), minus removed ones, plus a new one.
    existing = {p["id"]: p for p in current.get("app_profiles", [])}
    removed = set(_as_list(form.get("profile_remove")))
    profiles = []
    for pid, transport in zip(_as_list(form.get("profile_id")), _as_list(form.get("profile_transport"))):
        original = str(form.get(f"profile_original_{len(profiles)}", pid))
        if original in removed:
            profiles.append(None)
            continue
        base = dict(existing.get(original, {}))
        base.update({"id": str(pid).strip(), "transport": str(transport)})
        profiles.append(base)
    profiles = [p for p in profiles if p is not None]
    new_id = str(form.get("new_profile_id", "")).strip()
    if new_id:
        profiles.append({"id": new_id, "transport": str(form.get("new_profile_transport", "apns"))})
    push["app_profiles"] = profiles
    push["push_kinds"] = _kinds(str(form.get("push_kinds", "")), "push_kinds")
    push["urgent_kinds"] = _kinds(str(form.get("urgent_kinds", "")), "urgent_kinds")
    push["h_grammar"] = str(form.get("h_grammar", "uuid-v4-lowercase"))
    class_support: dict[str, list[str]] = {}
    for transport in sorted(TRANSPORTS):
        chosen = [c for c in CLASS_REGISTRY if form.get(f"cs_{transport}_{c}") == "on"]
        if chosen or any(p["transport"] == transport for p in profiles):
            class_support[transport] = chosen
    push["class_support"] = class_support
    limitation = {}
    for name in Limits.ADVERTISED:
        text = str(form.get(f"lim_{name}", "")).strip()
        if text:
            try:
                limitation[name] = int(text)
            except ValueError:
                raise ConfigError(f"limitation.{name}", text, "expected a whole number") from None
    if limitation:
        push["limitation"] = limitation
    skew = str(form.get("allowed_skew", "")).strip()
    if skew:
        try:
            push["allowed_skew"] = int(skew)
        except ValueError:
            raise ConfigError("allowed_skew", skew, "expected a whole number of seconds") from None
    endpoint = str(form.get("endpoint", "")).strip()
    if endpoint:
        push["endpoint"] = endpoint
    for key in current:
        if key not in push and key not in ("app_profiles", "push_kinds", "urgent_kinds", "h_grammar",
                                           "class_support", "limitation", "allowed_skew", "endpoint"):
            push[key] = current[key]
    return push


def failing_rule(exc: ConfigError) -> str:
    """`rule urgent-subset: ...` for descriptor rules, `field ...: ...` for the shape checks."""
    if exc.name.startswith("push descriptor of"):
        return f"Descriptor rule {exc.value}: {exc.hint}"
    return f"{exc.name}: {exc.hint} (value {exc.value!r})"


def routes(admin) -> list[Route]:
    settings = admin.settings

    async def origin_for(request: Request):
        wanted = request.query_params.get("origin")
        origins = await admin.read(load_origins)
        if wanted:
            for o in origins:
                if str(o.id) == str(wanted):
                    return o, origins
        chosen = next((o for o in origins if o.push), origins[0])
        return chosen, origins

    def preview(origin, push: dict) -> tuple[str, str]:
        """(NIP-11 push JSON, error) for a proposed push table."""
        if not push:
            return "", "Push is off for this origin: NIP-11 has no push object."
        try:
            checked = check_push_config(push, "push", origin.origin)
            check_push_fits_relay(checked, "push", settings.max_content_length)
            op = admin.app.push.origins.get(origin.id) if admin.app.push else None
            keys = op.current_descriptor(int(time.time())).keys if op else (PREVIEW_KEY,)
            desc = build_descriptor(origin.origin, checked, keys)
        except ConfigError as exc:
            return "", failing_rule(exc)
        return json.dumps({"push": descriptor_to_json(desc)}, indent=2), ""

    async def page(request: Request, error: str = "", status: int = 200, push: dict | None = None, origin=None):
        if origin is None:
            origin, origins = await origin_for(request)
        else:
            origins = await admin.read(load_origins)
        owned = await admin.read(lambda conn: owned_fields(conn, settings, origin))
        shown = origin.push if push is None else push
        preview_json, preview_error = preview(origin, shown)
        return admin.render(request, "admin/descriptor.html", status=status, section="descriptor", origin=origin,
                            origins=origins, push=shown, owned="push" in owned, error=error,
                            preview_json=preview_json, preview_error=preview_error, limits=Limits(),
                            advertised=Limits.ADVERTISED, transports=sorted(TRANSPORTS), classes=CLASS_REGISTRY,
                            grammars=sorted(H_GRAMMARS))

    async def save(request: Request):
        form = request.state.form
        origin = await admin.read(lambda conn: find(conn, int(form.get("origin", 0))))
        try:
            push = push_from_form(form, origin.push)
        except ConfigError as exc:
            return await page(request, failing_rule(exc), 400, origin=origin)
        try:
            await admin.write(lambda conn, ctx: set_push(conn, settings, origin.id, push))
        except ConfigError as exc:
            return await page(request, "Not saved. " + failing_rule(exc), 400, push=push, origin=origin)
        return admin.redirect(f"/descriptor?origin={origin.id}", "Descriptor saved; NIP-11 shows it now.")

    async def live_preview(request: Request):
        form = request.state.form
        origin = await admin.read(lambda conn: find(conn, int(form.get("origin", 0))))
        try:
            push = push_from_form(form, origin.push)
            text, error = preview(origin, push)
        except ConfigError as exc:
            text, error = "", failing_rule(exc)
        return admin.render(request, "admin/descriptor_preview.html", preview_json=text, preview_error=error)

    return [
        Route("/descriptor", admin.guard(page), methods=["GET"]),
        Route("/descriptor", admin.guard(save), methods=["POST"]),
        Route("/descriptor/preview", admin.guard(live_preview), methods=["POST"]),
    ]
