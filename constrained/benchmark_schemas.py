"""A corpus of realistic JSON schemas for the constrained benchmarks, written for radixgen.

`realistic_schemas()` returns 116 named schemas of the kinds requests carry: function-calling /
MCP tool parameters (the most frequent, one new schema per tool), API payloads and forms,
configuration files (Kubernetes-like with `x-kubernetes-*` extensions, CI-workflow-like), and
pydantic models (`$defs`, `$ref`, `anyOf` with null, discriminated unions, recursive trees).
No real-world corpus is copied or sampled here: every schema is hand-written or generated from
the small tables below.
"""

from __future__ import annotations

import copy

# ---- small constructors (keep the tables readable) ----


def string(max_length: int | None = None, **extra) -> dict:
    schema = {"type": "string", **extra}
    if max_length is not None:
        schema["maxLength"] = max_length
    return schema


def integer(minimum: int | None = None, maximum: int | None = None, **extra) -> dict:
    schema = {"type": "integer", **extra}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def enum(*values, **extra) -> dict:
    return {"type": "string", "enum": list(values), **extra}


def array(items: dict, max_items: int | None = None, min_items: int = 0) -> dict:
    schema = {"type": "array", "items": items}
    if min_items:
        schema["minItems"] = min_items
    if max_items is not None:
        schema["maxItems"] = max_items
    return schema


def obj(properties: dict, required: list[str] | None = None, closed: bool = True, **extra) -> dict:
    schema = {"type": "object", "properties": properties, **extra}
    if required:
        schema["required"] = required
    if closed:
        schema["additionalProperties"] = False
    return schema


def described(schema: dict, text: str) -> dict:
    return {**schema, "description": text}


# ---- function-calling / MCP tools: (name, {param: schema}, required) ----

_UNIT = enum("celsius", "fahrenheit")
_DATE = string(format="date")
_TOOLS = [
    ("get_weather", {"location": string(100), "unit": _UNIT}, ["location"]),
    ("get_forecast", {"city": string(80), "days": integer(1, 14), "unit": _UNIT}, ["city", "days"]),
    ("search_web", {"query": string(200), "num_results": integer(1, 20)}, ["query"]),
    ("send_email", {"to": string(format="email"), "subject": string(120), "body": string(2000),
                    "cc": array(string(format="email"), 5)}, ["to", "subject", "body"]),
    ("create_calendar_event", {"title": string(100), "date": _DATE, "start_time": string(format="time"),
                               "duration_minutes": integer(5, 480), "attendees": array(string(format="email"), 10)},
     ["title", "date", "start_time"]),
    ("book_flight", {"origin": string(pattern="^[A-Z]{3}$"), "destination": string(pattern="^[A-Z]{3}$"),
                     "date": _DATE, "passengers": integer(1, 9), "cabin": enum("economy", "premium", "business", "first")},
     ["origin", "destination", "date"]),
    ("convert_currency", {"amount": {"type": "number", "minimum": 0}, "from": string(pattern="^[A-Z]{3}$"),
                          "to": string(pattern="^[A-Z]{3}$")}, ["amount", "from", "to"]),
    ("get_stock_price", {"ticker": string(pattern="^[A-Z.]{1,6}$"), "exchange": enum("NYSE", "NASDAQ", "LSE")}, ["ticker"]),
    ("read_file", {"path": string(4096), "encoding": enum("utf-8", "latin-1", "ascii")}, ["path"]),
    ("write_file", {"path": string(4096), "content": string(), "append": {"type": "boolean"}}, ["path", "content"]),
    ("list_directory", {"path": string(4096), "recursive": {"type": "boolean"}, "max_depth": integer(1, 10)}, ["path"]),
    ("run_shell_command", {"command": string(1000), "timeout_s": integer(1, 600), "cwd": string(4096)}, ["command"]),
    ("git_commit", {"message": string(500), "files": array(string(4096), 50), "amend": {"type": "boolean"}}, ["message"]),
    ("create_github_issue", {"repo": string(pattern="^[\\w.-]+/[\\w.-]+$"), "title": string(256), "body": string(),
                             "labels": array(string(50), 10)}, ["repo", "title"]),
    ("query_database", {"sql": string(5000), "database": enum("analytics", "users", "billing"),
                        "limit": integer(1, 10000)}, ["sql", "database"]),
    ("translate_text", {"text": string(5000), "source_language": string(pattern="^[a-z]{2}$"),
                        "target_language": string(pattern="^[a-z]{2}$")}, ["text", "target_language"]),
    ("summarize_document", {"document_id": string(format="uuid"), "max_words": integer(10, 1000),
                            "style": enum("bullet", "paragraph", "tldr")}, ["document_id"]),
    ("set_reminder", {"text": string(200), "at": string(format="date-time"),
                      "repeat": enum("none", "daily", "weekly", "monthly")}, ["text", "at"]),
    ("add_todo", {"title": string(200), "priority": enum("low", "medium", "high"), "due": _DATE,
                  "tags": array(string(30), 8)}, ["title"]),
    ("get_directions", {"origin": string(200), "destination": string(200),
                        "mode": enum("driving", "walking", "bicycling", "transit")}, ["origin", "destination"]),
    ("find_restaurants", {"location": string(100), "cuisine": string(50), "price_level": integer(1, 4),
                          "open_now": {"type": "boolean"}}, ["location"]),
    ("order_pizza", {"size": enum("small", "medium", "large"), "toppings": array(enum(
        "cheese", "pepperoni", "mushroom", "olive", "onion", "pepper"), 6), "quantity": integer(1, 10),
        "address": string(300)}, ["size", "address"]),
    ("control_light", {"room": string(50), "on": {"type": "boolean"}, "brightness": integer(0, 100),
                       "color": string(pattern="^#[0-9a-fA-F]{6}$")}, ["room", "on"]),
    ("set_thermostat", {"temperature": {"type": "number", "minimum": 5, "maximum": 35},
                        "mode": enum("heat", "cool", "auto", "off")}, ["temperature"]),
    ("play_music", {"query": string(200), "shuffle": {"type": "boolean"}, "volume": integer(0, 100)}, ["query"]),
    ("calculate", {"expression": string(500)}, ["expression"]),
    ("lookup_customer", {"customer_id": string(pattern="^C[0-9]{6}$"), "include_orders": {"type": "boolean"}},
     ["customer_id"]),
    ("refund_order", {"order_id": string(pattern="^[0-9]{8}$"), "amount_cents": integer(1, 10_000_000),
                      "reason": enum("damaged", "late", "wrong_item", "other"), "note": string(500)},
     ["order_id", "reason"]),
    ("schedule_meeting", {"participants": array(string(format="email"), 20, 1), "duration_minutes": integer(15, 240),
                          "earliest": string(format="date-time"), "latest": string(format="date-time")},
     ["participants", "duration_minutes"]),
    ("create_invoice", {"customer_id": string(32), "currency": enum("USD", "EUR", "GBP", "JPY"),
                        "lines": array(obj({"description": string(200), "quantity": integer(1, 1000),
                                            "unit_price": {"type": "number", "minimum": 0}},
                                           ["description", "quantity", "unit_price"]), 50, 1)},
     ["customer_id", "currency", "lines"]),
    ("fetch_url", {"url": string(format="uri"), "method": enum("GET", "HEAD"), "max_bytes": integer(1, 10_000_000)},
     ["url"]),
    ("resize_image", {"image_id": string(format="uuid"), "width": integer(1, 8192), "height": integer(1, 8192),
                      "keep_aspect": {"type": "boolean"}}, ["image_id", "width"]),
    ("kubectl_get", {"resource": enum("pods", "services", "deployments", "nodes", "configmaps"),
                     "namespace": string(63, pattern="^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
                     "selector": string(200)}, ["resource"]),
    ("sql_schema", {"table": string(pattern="^[a-z_][a-z0-9_]{0,62}$")}, ["table"]),
    ("wikipedia_lookup", {"title": string(256), "language": string(pattern="^[a-z]{2,3}$"),
                          "sections": array(string(100), 5)}, ["title"]),
    ("create_user", {"username": string(32, pattern="^[a-z][a-z0-9_]{2,31}$"), "email": string(format="email"),
                     "role": enum("admin", "editor", "viewer"), "active": {"type": "boolean"}},
     ["username", "email", "role"]),
    ("log_workout", {"activity": enum("run", "cycle", "swim", "walk", "lift"), "minutes": integer(1, 600),
                     "distance_km": {"type": "number", "minimum": 0, "maximum": 500}, "date": _DATE},
     ["activity", "minutes"]),
    ("rate_product", {"product_id": string(40), "stars": integer(1, 5), "review": string(2000)},
     ["product_id", "stars"]),
    ("get_time", {"timezone": string(64, pattern="^[A-Za-z_]+(/[A-Za-z_]+)*$")}, []),
    ("ping_host", {"host": string(format="hostname"), "count": integer(1, 10)}, ["host"]),
    ("check_ip", {"address": string(format="ipv4")}, ["address"]),
    ("classify_ticket", {"category": enum("billing", "bug", "feature", "account", "other"),
                         "urgency": integer(1, 5), "summary": string(280)}, ["category", "urgency", "summary"]),
    ("extract_entities", {"people": array(string(100), 20), "organizations": array(string(100), 20),
                          "locations": array(string(100), 20), "dates": array(_DATE, 20)},
     ["people", "organizations", "locations"]),
    ("sentiment", {"label": enum("positive", "negative", "neutral"),
                   "score": {"type": "number", "minimum": 0, "maximum": 1}}, ["label", "score"]),
    ("answer_with_citations", {"answer": string(2000), "citations": array(obj(
        {"source_id": integer(0, 99), "quote": string(300)}, ["source_id", "quote"]), 5)}, ["answer", "citations"]),
]  # fmt: skip


def tool_schema(parameters: dict, required: list[str]) -> dict:
    """The parameters schema of one function / MCP tool, as clients send it."""
    return {
        "type": "object",
        "properties": parameters,
        "required": required,
        "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#",
    }


def _tool_call_envelope(name: str, parameters: dict, required: list[str]) -> dict:
    """An OpenAI-style forced tool call: {"name": ..., "arguments": {...}}."""
    return obj({"name": {"const": name}, "arguments": tool_schema(parameters, required)},
               ["name", "arguments"])  # fmt: skip


# ---- pydantic-style models ----

_ADDRESS = obj(
    {"street": string(200), "city": string(100), "postal_code": string(pattern="^[0-9A-Z -]{3,10}$"),
     "country": string(pattern="^[A-Z]{2}$")}, ["street", "city", "country"], title="Address")  # fmt: skip


def _pydantic(title: str, properties: dict, required: list[str], defs: dict | None = None) -> dict:
    schema = {"title": title, "type": "object", "properties": properties, "required": required}
    if defs:
        schema["$defs"] = defs
    return schema


def _optional(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}], "default": None}


_PYDANTIC = [
    _pydantic("Person", {"name": string(), "age": integer(0, 150), "email": _optional(string(format="email")),
                         "address": {"$ref": "#/$defs/Address"}}, ["name", "age"], {"Address": _ADDRESS}),
    _pydantic("Order", {"id": string(format="uuid"), "created_at": string(format="date-time"),
                        "items": array({"$ref": "#/$defs/Item"}, 20, 1),
                        "status": {"$ref": "#/$defs/Status"}, "shipping": {"$ref": "#/$defs/Address"}},
              ["id", "items", "status"],
              {"Item": obj({"sku": string(20), "qty": integer(1, 99), "price": {"type": "number"}},
                           ["sku", "qty", "price"], title="Item"),
               "Status": enum("pending", "paid", "shipped", "cancelled", title="Status"),
               "Address": _ADDRESS}),
    _pydantic("Pet", {"pet": {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
                              "discriminator": {"propertyName": "kind"}}}, ["pet"],
              {"Cat": obj({"kind": {"const": "cat"}, "lives": integer(0, 9)}, ["kind", "lives"]),
               "Dog": obj({"kind": {"const": "dog"}, "breed": string(40)}, ["kind", "breed"])}),
    _pydantic("TreeNode", {"value": integer(), "children": array({"$ref": "#/$defs/TreeNode"})}, ["value"],
              {"TreeNode": {"type": "object", "properties": {"value": integer(),
                            "children": array({"$ref": "#/$defs/TreeNode"})}, "required": ["value"]}}),
    _pydantic("Comment", {"author": string(50), "text": string(500),
                          "replies": array({"$ref": "#"}, 5)}, ["author", "text"]),
    _pydantic("Recipe", {"name": string(100), "servings": integer(1, 20),
                         "ingredients": array(obj({"name": string(60), "amount": {"type": "number"},
                                                   "unit": enum("g", "kg", "ml", "l", "tsp", "tbsp", "cup", "piece")},
                                                  ["name", "amount", "unit"]), 30, 1),
                         "steps": array(string(500), 20, 1), "vegetarian": {"type": "boolean"}},
              ["name", "ingredients", "steps"]),
    _pydantic("Resume", {"name": string(100), "skills": array(string(40), 20),
                         "experience": array({"$ref": "#/$defs/Job"}, 10),
                         "education": array({"$ref": "#/$defs/Degree"}, 5)}, ["name"],
              {"Job": obj({"company": string(100), "title": string(100), "start": _DATE,
                           "end": _optional(_DATE)}, ["company", "title", "start"]),
               "Degree": obj({"school": string(100), "degree": enum("BSc", "MSc", "PhD", "BA", "MA"),
                              "year": integer(1950, 2030)}, ["school", "degree"])}),
    _pydantic("Event", {"name": string(200), "starts": string(format="date-time"),
                        "location": {"anyOf": [{"$ref": "#/$defs/Venue"}, {"$ref": "#/$defs/Online"}]}},
              ["name", "starts", "location"],
              {"Venue": obj({"type": {"const": "venue"}, "address": _ADDRESS}, ["type", "address"]),
               "Online": obj({"type": {"const": "online"}, "url": string(format="uri")}, ["type", "url"])}),
    _pydantic("Filter", {"filter": {"$ref": "#/$defs/Expr"}}, ["filter"],
              {"Expr": {"anyOf": [
                  obj({"field": string(50), "op": enum("eq", "ne", "lt", "gt"), "value": {"type": ["string", "number"]}},
                      ["field", "op", "value"]),
                  obj({"and": array({"$ref": "#/$defs/Expr"}, 5, 1)}, ["and"]),
                  obj({"or": array({"$ref": "#/$defs/Expr"}, 5, 1)}, ["or"])]}}),
    _pydantic("Settings", {"theme": enum("light", "dark", "system"), "language": string(pattern="^[a-z]{2}(-[A-Z]{2})?$"),
                           "notifications": obj({"email": {"type": "boolean"}, "push": {"type": "boolean"},
                                                 "digest": enum("never", "daily", "weekly")}, ["email", "push"]),
                           "metadata": {"type": "object", "additionalProperties": string(200)}},
              ["theme"]),
]  # fmt: skip


# ---- configuration files and API payloads ----

_LABELS = {"type": "object", "additionalProperties": string(63)}
_CONTAINER = obj(
    {"name": string(63, pattern="^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"), "image": string(255),
     "args": array(string()), "env": array(obj({"name": string(), "value": string()}, ["name"]), 50),
     "ports": array(obj({"containerPort": integer(1, 65535), "protocol": enum("TCP", "UDP")},
                        ["containerPort"], **{"x-kubernetes-map-type": "atomic"}), 20),
     "resources": obj({"limits": _LABELS, "requests": _LABELS})},
    ["name", "image"], **{"x-kubernetes-patch-merge-key": "name"})  # fmt: skip
_K8S_META = obj({"name": string(253), "namespace": string(63), "labels": _LABELS,
                 "annotations": _LABELS}, ["name"])  # fmt: skip
_CONFIGS = [
    obj({"apiVersion": {"const": "apps/v1"}, "kind": {"const": "Deployment"}, "metadata": _K8S_META,
         "spec": obj({"replicas": integer(0, 1000), "selector": obj({"matchLabels": _LABELS}),
                      "template": obj({"metadata": _K8S_META, "spec": obj(
                          {"containers": array(_CONTAINER, 10, 1)}, ["containers"])})}, ["template"])},
        ["apiVersion", "kind", "metadata", "spec"], **{"x-kubernetes-group-version-kind": [
            {"group": "apps", "kind": "Deployment", "version": "v1"}]}),
    obj({"apiVersion": {"const": "v1"}, "kind": {"const": "ConfigMap"}, "metadata": _K8S_META,
         "data": _LABELS}, ["apiVersion", "kind", "metadata"]),
    obj({"apiVersion": {"const": "v1"}, "kind": {"const": "Service"}, "metadata": _K8S_META,
         "spec": obj({"type": enum("ClusterIP", "NodePort", "LoadBalancer"), "selector": _LABELS,
                      "ports": array(obj({"port": integer(1, 65535), "targetPort": {"anyOf": [
                          integer(1, 65535), string(15)]}, "name": string(15)}, ["port"]), 10, 1)},
                     ["ports"])}, ["apiVersion", "kind", "metadata", "spec"]),
    {"type": "object", "required": ["on", "jobs"], "additionalProperties": False, "properties": {
        "name": string(), "on": {"oneOf": [enum("push", "pull_request", "workflow_dispatch"),
                                          array(enum("push", "pull_request", "workflow_dispatch"), 3, 1)]},
        "env": {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}},
        "jobs": {"type": "object", "minProperties": 1, "additionalProperties": False,
                 "patternProperties": {"^[_a-zA-Z][a-zA-Z0-9_-]*$": obj(
                     {"runs-on": string(), "needs": array(string(), 10),
                      "steps": array(obj({"name": string(), "uses": string(), "run": string(),
                                          "with": {"type": "object", "additionalProperties": string()}}), 50, 1)},
                     ["runs-on", "steps"])}}}},
    obj({"version": {"const": 2}, "updates": array(obj(
        {"package-ecosystem": enum("pip", "npm", "cargo", "gomod", "docker", "github-actions"),
         "directory": string(), "schedule": obj({"interval": enum("daily", "weekly", "monthly")}, ["interval"]),
         "open-pull-requests-limit": integer(0, 50)}, ["package-ecosystem", "directory", "schedule"]), 20, 1)},
        ["version", "updates"]),
    obj({"name": string(214, pattern="^(@[a-z0-9-~][a-z0-9-._~]*/)?[a-z0-9-~][a-z0-9-._~]*$"),
         "version": string(pattern="^(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)$"),
         "description": string(), "private": {"type": "boolean"},
         "scripts": {"type": "object", "additionalProperties": string()},
         "dependencies": {"type": "object", "additionalProperties": string(100)}}, ["name", "version"],
        closed=False),
    obj({"log_level": enum("debug", "info", "warning", "error"), "port": integer(1, 65535),
         "host": string(format="hostname"), "workers": integer(1, 64), "tls": obj(
             {"enabled": {"type": "boolean"}, "cert_file": string(), "key_file": string()}, ["enabled"]),
         "database": obj({"url": string(format="uri"), "pool_size": integer(1, 100),
                          "timeout_s": {"type": "number", "exclusiveMinimum": 0}}, ["url"])}, ["port"]),
    obj({"type": {"const": "FeatureCollection"}, "features": array(obj(
        {"type": {"const": "Feature"}, "geometry": obj({"type": {"const": "Point"}, "coordinates": {
            "type": "array", "prefixItems": [{"type": "number", "minimum": -180, "maximum": 180},
                                             {"type": "number", "minimum": -90, "maximum": 90}],
            "items": False, "minItems": 2}}, ["type", "coordinates"]),
         "properties": {"type": "object"}}, ["type", "geometry"]), 100)}, ["type", "features"]),
    obj({"event": enum("page_view", "click", "purchase", "signup"), "user_id": string(format="uuid"),
         "timestamp": string(format="date-time"), "properties": obj(
             {"url": string(format="uri"), "referrer": string(), "value_cents": integer(0)}, closed=False)},
        ["event", "user_id", "timestamp"]),
    obj({"jsonrpc": {"const": "2.0"}, "id": {"type": ["integer", "string"]}, "method": string(100),
         "params": {"type": "object"}}, ["jsonrpc", "method"]),
    obj({"headline": string(120), "byline": string(80), "published": string(format="date-time"),
         "section": enum("world", "business", "tech", "sport", "culture"), "tags": array(string(30), 10),
         "body": array(obj({"type": enum("paragraph", "heading", "quote"), "text": string()},
                           ["type", "text"]), 40, 1)}, ["headline", "published", "body"]),
    obj({"question": string(500), "options": array(string(200), 6, 2), "answer_index": integer(0, 5),
         "explanation": string(1000)}, ["question", "options", "answer_index"]),
    obj({"reasoning": array(string(300), 8, 1), "final_answer": {"type": "number"}},
        ["reasoning", "final_answer"]),
    obj({"is_spam": {"type": "boolean"}, "confidence": {"type": "number", "minimum": 0, "maximum": 1},
         "reasons": array(enum("links", "urgency", "sender", "content", "attachments"), 5)},
        ["is_spam", "confidence"]),
    obj({"sku": string(pattern="^[A-Z]{3}-[0-9]{4}$"), "name": string(120), "price": {
        "type": "number", "exclusiveMinimum": 0, "multipleOf": 0.01}, "stock": integer(0),
         "dimensions_cm": obj({"w": {"type": "number"}, "h": {"type": "number"}, "d": {"type": "number"}},
                              ["w", "h", "d"])}, ["sku", "name", "price"]),
    obj({"patient_id": string(pattern="^P[0-9]{7}$"), "visit_date": _DATE, "vitals": obj(
        {"heart_rate": integer(20, 250), "systolic": integer(50, 250), "diastolic": integer(30, 150),
         "temperature_c": {"type": "number", "minimum": 30, "maximum": 45}}),
         "diagnoses": array(obj({"code": string(pattern="^[A-Z][0-9]{2}(\\.[0-9]{1,2})?$"),
                                 "description": string(200)}, ["code"]), 10)}, ["patient_id", "visit_date"]),
]  # fmt: skip


def realistic_schemas() -> list[tuple[str, dict]]:
    """(name, schema) pairs, fresh copies (callers may mutate them)."""
    corpus: list[tuple[str, dict]] = []
    for name, parameters, required in _TOOLS:
        corpus.append((f"tool:{name}", tool_schema(parameters, required)))
        corpus.append((f"tool-call:{name}", _tool_call_envelope(name, parameters, required)))
    corpus += [(f"pydantic:{schema['title']}", schema) for schema in _PYDANTIC]
    corpus += [(f"config:{index}", schema) for index, schema in enumerate(_CONFIGS)]
    return copy.deepcopy(corpus)
