"""Descriptor: an origin's NIP-PL push settings (push kinds, urgent kinds, h_grammar, class support,
every limitation value, app profiles), checked against every descriptor rule before saving (the
failing rule is named), with a live preview of the NIP-11 `push` object."""

from __future__ import annotations

import json
import time

from starlette.requests import Request
from starlette.routing import Route

from appliance.commands.origins import find, owned_fields, set_push, store_apns_key, store_service_account
from appliance.errors import ConfigError
from appliance.origins import load_origins
from appliance.store.credentials import list_apns_keys

from ..web import Upload
from appliance.push.config import (
    APP_PROFILE_FIELDS,
    build_descriptor,
    check_push_config,
    check_push_fits_relay,
    profile_fields,
)
from appliance.push.descriptor import CLASS_REGISTRY, H_GRAMMARS, LIMIT_HELP, TRANSPORTS, ExecutorKey, Limits, \
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


# APNs credential fields edited as text (key_file is write-only: empty keeps the current key).
CREDENTIAL_TEXT = ("topic", "team_id", "key_id", "environment", "apns_url", "ca_file")
CREDENTIALS = CREDENTIAL_TEXT + ("key_file", "key_stored")


# An fcm profile's settings edited as text (service_account_file is write-only, as key_file).
FCM_TEXT = ("project_id", "fcm_url", "token_uri", "ca_file")


def _fcm_credentials(form: dict, i: int, base: dict, uploads: list) -> dict:
    """Apply the fcm settings of profile row `i` to its entry; a service account upload is queued in
    `uploads` as (entry, bytes, "service_account_stored")."""
    from appliance.transports.fcm import FCM_FIELDS

    if form.get(f"cred_{i}_clear") == "on":
        return {k: v for k, v in base.items() if k not in FCM_FIELDS}
    for name in FCM_TEXT:
        key = f"cred_{i}_{name}"
        if key in form:
            value = str(form[key]).strip()
            if value:
                base[name] = value
            else:
                base.pop(name, None)
    path = str(form.get(f"cred_{i}_service_account_file", "")).strip()
    if path:
        base["service_account_file"] = path
        base.pop("service_account_stored", None)
    upload = form.get(f"cred_{i}_sa")
    data = upload.data if isinstance(upload, Upload) else None
    if data:
        base.pop("service_account_file", None)
        uploads.append((base, data, "service_account_stored"))
    return base


def _credentials(form: dict, i: int, base: dict, uploads: list) -> dict:
    """Apply the credential fields of profile row `i` to its entry; a .p8 upload is queued in
    `uploads` as (entry, bytes, "key_stored") for the caller to store (it names the stored key in
    the entry)."""
    if form.get(f"cred_{i}_clear") == "on":
        return {k: v for k, v in base.items() if k not in CREDENTIALS}
    for field in CREDENTIAL_TEXT:
        key = f"cred_{i}_{field}"
        if key in form:
            value = str(form[key]).strip()
            if value:
                base[field] = value
            else:
                base.pop(field, None)
    key_file = str(form.get(f"cred_{i}_key_file", "")).strip()
    if key_file:
        base["key_file"] = key_file
        base.pop("key_stored", None)
    upload = form.get(f"cred_{i}_p8")
    data = upload.data if isinstance(upload, Upload) else None
    if data:
        base.pop("key_file", None)
        uploads.append((base, data, "key_stored"))
    return base


def push_from_form(form: dict, current: dict, uploads: list | None = None) -> dict:
    """The push table an edit form describes ({} when push is switched off)."""
    uploads = [] if uploads is None else uploads
    if form.get("push_enabled") != "on":
        return {}
    push: dict = {}
    # App profiles: the existing rows (extra keys such as credentials kept), minus removed ones, plus a new one.
    existing = {p["id"]: p for p in current.get("app_profiles", [])}
    removed = set(_as_list(form.get("profile_remove")))
    profiles = []
    for i, (pid, transport) in enumerate(zip(_as_list(form.get("profile_id")), _as_list(form.get("profile_transport")))):
        original = str(form.get(f"profile_original_{i}", pid))
        if original in removed:
            continue
        base = dict(existing.get(original, {}))
        base.update({"id": str(pid).strip(), "transport": str(transport)})
        if base["transport"] != "apns":
            # Another transport's settings: only its own kind's fields are kept.
            allowed = set(profile_fields(base["transport"]))
            base = {k: v for k, v in base.items() if k in allowed}
        else:
            base = {k: v for k, v in base.items() if k in APP_PROFILE_FIELDS}
        if base["transport"] == "apns" and not base.get("gateway_url"):
            base = _credentials(form, i, base, uploads)
        elif base["transport"] == "fcm":
            base = _fcm_credentials(form, i, base, uploads)
        profiles.append(base)
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


# Largest .p8 accepted (Apple's are about 250 bytes).
MAX_P8 = 8192
# Largest service account key file accepted (Google's are about 2.3 KiB).
MAX_SA = 64 * 1024


async def read_uploads(form: dict) -> None:
    """Refuse an uploaded .p8 or service account file that is too large to be one, before anything else."""
    for key, value in form.items():
        if key.endswith("_p8") and isinstance(value, Upload) and len(value.data) > MAX_P8:
            raise ConfigError("key", value.filename, "not an APNs .p8 key: the file is too large")
        if key.endswith("_sa") and isinstance(value, Upload) and len(value.data) > MAX_SA:
            raise ConfigError("service_account", value.filename, "not a service account key file: too large")


def credential_summary(entry: dict, stored: dict[str, int]) -> str:
    """What the dashboard says about a profile's credentials: never the key, only a fingerprint."""
    from appliance.transports.credentials import CredentialError, key_fingerprint, load_p8

    if entry.get("gateway_url"):
        return f"delivers through the APNs gateway {entry['gateway_url']}"
    if entry.get("transport") == "fcm":
        return fcm_summary(entry, stored)
    if entry.get("key_stored"):
        where = "uploaded, in the database" if entry["key_stored"] in stored else "uploaded key MISSING"
        return f"key {entry['key_stored']} ({where})"
    if entry.get("key_file"):
        try:
            return f"key {key_fingerprint(load_p8(entry['key_file']))} (from a file)"
        except CredentialError as exc:
            return f"key file unusable: {exc}"
    return "no credentials: wakes wait as configuration faults"


#: What the test-wake form asks for, by transport (APNs: a device token).
ENDPOINT_LABELS = {"fcm": "FCM registration token", "unifiedpush": "Distributor endpoint URL"}


def testable_transports(settings) -> set[str]:
    """The transports a test wake can be sent through: APNs, and the draft ones while they are on."""
    from appliance.push.kinds import KINDS, is_draft

    return {"apns"} | {t for t in KINDS if not is_draft(t) or settings.push_draft_transports}


def endpoint_hints() -> dict[str, str]:
    from appliance.push.kinds import KINDS

    return {t: k.endpoint_hint for t, k in KINDS.items()}


def fcm_summary(entry: dict, stored: dict[str, int]) -> str:
    """What the dashboard says about an fcm profile's service account: never the key."""
    from appliance.transports.credentials import CredentialError
    from appliance.transports.fcm import ServiceAccount

    if entry.get("service_account_stored"):
        fp = entry["service_account_stored"]
        return f"service account {fp} ({'uploaded, in the database' if fp in stored else 'uploaded account MISSING'})"
    if entry.get("service_account_file"):
        try:
            account = ServiceAccount.load(entry["service_account_file"])
        except CredentialError as exc:
            return f"service account file unusable: {exc}"
        return f"service account {account.client_email} {account.fingerprint} (from a file)"
    return "no service account: wakes wait as configuration faults"


# The form's labels, by the push table's field names (what an error names instead of the path).
FIELD_LABELS = {
    "app_profiles": "App profiles", "push_kinds": "Push kinds", "urgent_kinds": "Urgent kinds",
    "h_grammar": "h grammar", "class_support": "Class support", "limitation": "Limitation",
    "allowed_skew": "allowed_skew (seconds)", "endpoint": "Executor endpoint", "key": ".p8 key (upload)",
}
PROFILE_LABELS = {
    "id": "Id", "transport": "Transport", "topic": "Topic (bundle id)", "team_id": "Team id", "key_id": "Key id",
    "key_file": ".p8 path on this server", "key_stored": ".p8 key (upload)", "environment": "Environment",
    "apns_url": "APNs URL override", "ca_file": "Extra CA file", "gateway_url": "gateway_url",
    "service_account_file": "service account file on this server",
    "service_account_stored": "service account (upload)", "project_id": "Project id",
    "fcm_url": "FCM URL override", "token_uri": "Token endpoint override",
}


def form_field(name: str, push: dict | None = None) -> str:
    """A push setting's name (`push.app_profiles[0].key_file`) as the form's field label says it
    (`App profile com.example.app/ios: or a .p8 path on this server`)."""
    import re

    path = re.sub(r"^(\[push\] |push\.|push$|limitation\.)", "", name) if name != "limitation" else name
    if name.startswith("limitation.") or path.startswith("limitation."):
        return "Limitation " + path.split(".", 1)[-1]
    m = re.fullmatch(r"app_profiles\[(\d+)\](?:\.(\w+))?", path)
    if m:
        profiles = (push or {}).get("app_profiles", [])
        i = int(m.group(1))
        pid = profiles[i].get("id") if i < len(profiles) and isinstance(profiles[i], dict) else None
        label = f"App profile {pid}" if pid else f"App profile {i + 1}"
        return f"{label}: {PROFILE_LABELS.get(m.group(2), m.group(2))}" if m.group(2) else label
    return FIELD_LABELS.get(path, path or "Push")


def failing_rule(exc: ConfigError, push: dict | None = None) -> str:
    """`Descriptor rule urgent-subset: ...` for descriptor rules; `<form field>: <why> (value ...)`
    for the shape checks, the field named as the form labels it."""
    if exc.name.startswith("push descriptor of"):
        return f"Descriptor rule {exc.value}: {exc.hint}"
    import re

    label = form_field(exc.name, push)
    hint = exc.hint
    if label.startswith("App profile "):  # the label names the profile already
        hint = re.sub(r"^app profile '[^']*': ", "", hint)
    hint = re.sub(r" \(at wss?://[^)\s]*\)$", "", hint)  # this page is the origin's
    value = "" if exc.value in (None, "", [], {}) else f" (value {exc.value!r})"
    return f"{label}: {hint}{value}"


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
            desc = build_descriptor(origin.origin, checked, keys, drafts=settings.push_draft_transports)
        except ConfigError as exc:
            return "", failing_rule(exc, push)
        return json.dumps({"push": descriptor_to_json(desc)}, indent=2), ""

    async def page(request: Request, error: str = "", status: int = 200, push: dict | None = None, origin=None):
        if origin is None:
            origin, origins = await origin_for(request)
        else:
            origins = await admin.read(load_origins)
        owned = await admin.read(lambda conn: owned_fields(conn, settings, origin))
        shown = origin.push if push is None else push
        stored = dict(await admin.read(list_apns_keys))
        summaries = {p["id"]: credential_summary(p, stored) for p in shown.get("app_profiles", [])}
        preview_json, preview_error = preview(origin, shown)
        return admin.render(request, "admin/descriptor.html", status=status, section="descriptor", origin=origin,
                            origins=origins, push=shown, owned="push" in owned, error=error,
                            preview_json=preview_json, preview_error=preview_error, limits=Limits(),
                            advertised=Limits.ADVERTISED, transports=sorted(TRANSPORTS), classes=CLASS_REGISTRY,
                            grammars=sorted(H_GRAMMARS), summaries=summaries, environments=("production", "sandbox"),
                            limit_help=LIMIT_HELP, drafts_on=settings.push_draft_transports,
                            testable=testable_transports(settings), endpoint_labels=ENDPOINT_LABELS,
                            endpoint_hints=endpoint_hints(), saved_push=origin.push)

    async def save(request: Request):
        form = request.state.form
        origin = await admin.read(lambda conn: find(conn, int(form.get("origin", 0))))
        uploads: list = []
        try:
            await read_uploads(form)
            push = push_from_form(form, origin.push, uploads)
        except ConfigError as exc:
            return await page(request, failing_rule(exc), 400, origin=origin)
        now = int(time.time())

        def op(conn, ctx):
            for entry, data, field in uploads:  # kept wrapped by the key file; the profile names it
                store = store_service_account if field == "service_account_stored" else store_apns_key
                entry[field] = store(conn, admin.app.keyfile, data, now)
            return set_push(conn, settings, origin.id, push)

        try:
            await admin.write(op)
        except ConfigError as exc:
            return await page(request, "Not saved. " + failing_rule(exc, push), 400, push=push, origin=origin)
        return admin.redirect(f"/descriptor?origin={origin.id}", "Descriptor saved; NIP-11 shows it now.")

    async def live_preview(request: Request):
        form = request.state.form
        origin = await admin.read(lambda conn: find(conn, int(form.get("origin", 0))))
        uploads: list = []
        try:
            await read_uploads(form)
            push = push_from_form(form, origin.push, uploads)
            for entry, _data, field in uploads:  # stored (and named) on save
                entry[field] = "sa:uploaded" if field == "service_account_stored" else "p8:uploaded"
            text, error = preview(origin, push)
        except ConfigError as exc:
            text, error = "", failing_rule(exc)
        return admin.render(request, "admin/descriptor_preview.html", preview_json=text, preview_error=error)

    return [
        Route("/descriptor", admin.guard(page), methods=["GET"]),
        Route("/descriptor", admin.guard(save), methods=["POST"]),
        Route("/descriptor/preview", admin.guard(live_preview), methods=["POST"]),
    ]
