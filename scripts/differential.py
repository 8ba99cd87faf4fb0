#!/usr/bin/env python3
"""Differential test of the server's proto3 JSON against Google's protobuf.

Builds the message classes from the server's own descriptor set, generates
random messages of every request and response type, and checks that:

1. every JSON form Google's `json_format` writes (proto or camelCase names,
   enums as names or numbers, defaults included or not, 64-bit integers
   quoted or not), and the other canonical forms (integers as strings or in
   exponent form, `null` for defaults, unknown fields of any shape), decodes
   on the server to exactly the original message (the decode-echo route of the
   test harness answers the decoded message as binary protobuf);
2. the same JSON sent to the real RPC routes is never refused as malformed;
3. JSON the server writes (the encode-echo route) parses with
   `json_format.Parse` to exactly the message it was written from;
4. a request that is not proto3 JSON (wrong types, fractions, out-of-range
   integers, duplicate fields) is refused by both the server and Google.

Run by tests/it/differential.rs, which starts the server and passes the URL
and the descriptor set. Prints one summary line and exits non-zero on any
mismatch.
"""

import argparse
import json
import random
import sys
import urllib.error
import urllib.request

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import FieldDescriptor as FD

SERVICE = "yadcc.scheduler.SchedulerService"
INT_RANGES = {
    FD.TYPE_INT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1),
    FD.TYPE_FIXED32: (0, 2**32 - 1),
    FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1),
    FD.TYPE_FIXED64: (0, 2**64 - 1),
}
ALPHABET = (
    "abcXYZ019 _-:./\"\\'\t\n\r\x00\x01\x1f\x7f"
    "é中文ß\u2028\u2029\ufeff"
    "😀𝄞\U0010ffff"
)


class Failures:
    def __init__(self):
        self.items = []

    def add(self, what):
        self.items.append(what)
        if len(self.items) <= 20:
            print("MISMATCH:", what, file=sys.stderr)


def post(url, body, content_type):
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def random_int(rng, field_type):
    low, high = INT_RANGES[field_type]
    choice = rng.random()
    if choice < 0.15:
        return rng.choice([low, high, 0, 1, max(low, -1)])
    bits = rng.choice([4, 8, 16, 31, 32, 53, 63, 64])
    value = rng.getrandbits(bits)
    if low < 0 and rng.random() < 0.3:
        value = -value
    return min(max(value, low), high)


def random_string(rng):
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 12)))


def random_scalar(rng, field):
    if field.type in INT_RANGES:
        return random_int(rng, field.type)
    if field.type == FD.TYPE_BOOL:
        return rng.random() < 0.5
    if field.type == FD.TYPE_STRING:
        return random_string(rng)
    if field.type == FD.TYPE_BYTES:
        return bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 10)))
    if field.type == FD.TYPE_ENUM:
        # Known values only: the server refuses numbers the enum does not define.
        return rng.choice(field.enum_type.values).number
    if field.type in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        return rng.choice([0.0, 1.5, -2.25, 1e10])
    raise ValueError(f"no generator for {field.full_name}")


def repeated(field):
    # protobuf 5.29 added `is_repeated`; later versions dropped `label`.
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == FD.LABEL_REPEATED


def fill(rng, message, depth=0):
    for field in message.DESCRIPTOR.fields:
        is_repeated = repeated(field)
        if rng.random() < 0.3:
            continue  # left at its default
        if field.type == FD.TYPE_MESSAGE:
            if is_repeated:
                for _ in range(rng.randrange(0, 4)):
                    fill(rng, getattr(message, field.name).add(), depth + 1)
            else:
                inner = getattr(message, field.name)
                inner.SetInParent()
                if depth < 3:
                    fill(rng, inner, depth + 1)
        elif is_repeated:
            getattr(message, field.name).extend(
                random_scalar(rng, field) for _ in range(rng.randrange(0, 5))
            )
        else:
            setattr(message, field.name, random_scalar(rng, field))
    return message


def integer_forms(rng, value):
    """Other canonical spellings of an integer (a JSON value)."""
    forms = [value, str(value)]
    if abs(value) < 2**53:
        forms.append(float(value))
    if value != 0 and value % 1000 == 0 and abs(value) < 2**53:
        forms.append(f"{value // 1000}e3")
    if abs(value) < 2**53:
        forms.append(f"{value}.0")
        forms.append(f"{value}e0")
    return rng.choice(forms)


def respell(rng, descriptor, value):
    """Rewrites a MessageToDict value into other canonical forms."""
    out = {}
    for key, item in value.items():
        field = descriptor.fields_by_camelcase_name.get(key) or descriptor.fields_by_name.get(key)
        if field is None:
            out[key] = item
            continue
        name = rng.choice([field.name, field.json_name])

        def one(element):
            if field.type == FD.TYPE_MESSAGE:
                return respell(rng, field.message_type, element)
            if field.type in INT_RANGES:
                return integer_forms(rng, int(element))
            if field.type == FD.TYPE_ENUM and isinstance(element, str) and rng.random() < 0.5:
                return field.enum_type.values_by_name[element].number
            return element

        if isinstance(item, list):
            out[name] = [one(element) for element in item]
        else:
            out[name] = one(item)
    # Defaults spelled as null, unknown fields of any shape.
    for field in descriptor.fields:
        if field.json_name not in out and field.name not in out and rng.random() < 0.3:
            out[rng.choice([field.name, field.json_name])] = None
    for _ in range(rng.randrange(0, 3)):
        unknown = rng.choice(
            [None, 1, -2.5, "x", True, [], [1, {"a": None}], {"deep": {"er": [None]}}]
        )
        out[f"unknownField{rng.randrange(1000)}"] = unknown
    return out


def google_json(rng, message):
    options = dict(
        preserving_proto_field_name=rng.random() < 0.5,
        use_integers_for_enums=rng.random() < 0.5,
        always_print_fields_with_no_presence=rng.random() < 0.5,
        indent=rng.choice([None, 0, 2]),
        ensure_ascii=rng.random() < 0.5,
    )
    try:
        return json_format.MessageToJson(
            message, unquote_int64_if_possible=rng.random() < 0.5, **options
        )
    except TypeError:  # an older protobuf without that option
        return json_format.MessageToJson(message, **options)


def check_requests(args, rng, classes, failures):
    counted = 0
    for name, cls in classes["requests"].items():
        for index in range(args.count):
            original = fill(rng, cls())
            if index % 3 == 2:
                as_dict = json_format.MessageToDict(
                    original, preserving_proto_field_name=rng.random() < 0.5
                )
                text = json.dumps(respell(rng, original.DESCRIPTOR, as_dict))
                how = "respelled"
            else:
                text = google_json(rng, original)
                how = "json_format"
            status, body = post(f"{args.url}/test/decode/{name}", text.encode(), "application/json")
            if status != 200:
                failures.add(f"{name} ({how}) refused: {status} {body[:200]!r} for {text[:300]}")
                continue
            decoded = cls.FromString(body)
            if decoded != original:
                failures.add(f"{name} ({how}) decoded as {decoded} instead of {original} from {text[:300]}")
            counted += 1
            if index % 10 == 0:
                check_live(args, name, text, failures)
    return counted


def scheduler_outcomes(readme):
    """(HTTP status, rpc code) of every scheduler `Status` row of docs/api.md's
    error table: the answers a well-formed call may get besides 200."""
    outcomes = set()
    for line in readme.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`STATUS_") and cells[1].isdigit() and cells[2].isdigit():
            if int(cells[2]) >= 1000:
                outcomes.add((int(cells[1]), int(cells[2])))
    if not outcomes:
        raise SystemExit("no scheduler rows found in the error table of docs/api.md")
    return outcomes


def check_live(args, name, text, failures):
    """The real routes decode it too, and answer 200 or a scheduler status of
    the error table (a random token is refused, a random digest not found):
    never "malformed" (framework code 5), never an internal error."""
    method = classes_methods[name]
    if method == "WaitForStartingTask":
        # Would long-poll; the decode-echo route covers its decoding.
        return
    for path in (f"/rpc/{SERVICE}.{method}", f"/{SERVICE}/{method}"):
        status, body = post(args.url + path, text.encode(), "application/json")
        if status == 200:
            continue
        try:
            code = json.loads(body).get("rpcErrorCode")
        except ValueError:
            code = None
        if (status, code) not in args.outcomes:
            failures.add(f"{path} answered {status} (code {code}) to {text[:200]}: {body[:200]!r}")


def check_responses(args, rng, classes, failures):
    counted = 0
    for name, cls in classes["responses"].items():
        for _ in range(args.count):
            original = fill(rng, cls())
            status, body = post(
                f"{args.url}/test/encode/{name}",
                original.SerializeToString(),
                "application/x-protobuf",
            )
            if status != 200:
                failures.add(f"{name}: encode-echo answered {status} {body[:200]!r}")
                continue
            try:
                parsed = json_format.Parse(body.decode("utf-8"), cls())
            except json_format.ParseError as error:
                failures.add(f"{name}: Google cannot parse the server's JSON {body[:300]!r}: {error}")
                continue
            if parsed != original:
                failures.add(f"{name}: server wrote {body[:300]!r} for {original}")
            counted += 1
    return counted


def check_live_answers(args, classes, failures):
    """Real answers in JSON and binary are the same message."""
    checked = 0
    for method, request in [
        ("GetConfig", {"token": "differential"}),
        ("GetRunningTasks", {}),
        ("Heartbeat", {"token": "differential", "location": "127.0.0.1:1", "capacity": 2,
                       "envDescs": [{"compilerDigest": "d"}], "nextHeartbeatInMs": 10000}),
        ("KeepTaskAlive", {"token": "differential", "taskGrantIds": ["1", 2]}),
    ]:
        request_cls = classes["by_method"][method][0]
        response_cls = classes["by_method"][method][1]
        binary_request = json_format.ParseDict(request, request_cls()).SerializeToString()
        for path in (f"/rpc/{SERVICE}.{method}", f"/{SERVICE}/{method}"):
            status_json, body_json = post(args.url + path, json.dumps(request).encode(), "application/json")
            status_bin, body_bin = post(args.url + path, binary_request, "application/x-protobuf")
            if status_json != 200 or status_bin != 200:
                failures.add(f"{path}: answered {status_json}/{status_bin}: {body_json[:200]!r}")
                continue
            from_json = json_format.Parse(body_json.decode("utf-8"), response_cls())
            from_binary = response_cls.FromString(body_bin)
            if from_json != from_binary:
                failures.add(f"{path}: JSON answer {from_json} differs from binary {from_binary}")
            checked += 1
    return checked


def check_refusals(args, classes, failures):
    """Not proto3 JSON: refused by Google's parser and by the server alike."""
    cases = [
        ("yadcc.scheduler.KeepTaskAliveRequest", '{"nextKeepAliveInMs": 1.5}'),
        ("yadcc.scheduler.KeepTaskAliveRequest", '{"nextKeepAliveInMs": "1.5"}'),
        ("yadcc.scheduler.KeepTaskAliveRequest", '{"nextKeepAliveInMs": -1}'),
        ("yadcc.scheduler.KeepTaskAliveRequest", '{"nextKeepAliveInMs": 4294967296}'),
        ("yadcc.scheduler.KeepTaskAliveRequest", '{"nextKeepAliveInMs": true}'),
        ("yadcc.scheduler.KeepTaskAliveRequest", '{"nextKeepAliveInMs": "abc"}'),
        ("yadcc.scheduler.KeepTaskAliveRequest", '{"nextKeepAliveInMs": " 1"}'),
        ("yadcc.scheduler.KeepTaskAliveRequest", '{"taskGrantIds": ["18446744073709551616"]}'),
        ("yadcc.scheduler.KeepTaskAliveRequest", '{"taskGrantIds": [1, null]}'),
        ("yadcc.scheduler.KeepTaskAliveRequest", '{"taskGrantIds": 1}'),
        ("yadcc.scheduler.KeepTaskAliveRequest", '{"token": 5}'),
        ("yadcc.scheduler.KeepTaskAliveRequest", '{"token": "a", "token": "b"}'),
        ("yadcc.scheduler.HeartbeatRequest", '{"servantPriority": "NOT_A_PRIORITY"}'),
        ("yadcc.scheduler.HeartbeatRequest", '{"envDescs": [{"compilerDigest": 1}]}'),
        ("yadcc.scheduler.HeartbeatRequest", '{"envDescs": {"compilerDigest": "d"}}'),
        ("yadcc.scheduler.WaitForStartingTaskRequest", '{"envDesc": "d"}'),
        ("yadcc.scheduler.KeepTaskAliveRequest", '{"nextKeepAliveInMs": 1e400}'),
        # No JSON value at all: a message needs at least `{}`.
        ("yadcc.scheduler.GetRunningTasksRequest", ""),
        ("yadcc.scheduler.GetRunningTasksRequest", " \t\r\n"),
        ("yadcc.scheduler.KeepTaskAliveRequest", '{"future": {"a": 1, "a": 2}}'),
    ]
    for name, text in cases:
        cls = classes["all"][name]
        try:
            json_format.Parse(text, cls())
            google_refuses = False
        except (json_format.ParseError, ValueError, TypeError):
            google_refuses = True
        status, body = post(f"{args.url}/test/decode/{name}", text.encode(), "application/json")
        server_refuses = status == 400
        if not google_refuses:
            failures.add(f"the refusal case {text} is accepted by Google: not a refusal case")
        elif not server_refuses:
            failures.add(f"{name}: server accepted {text}, which Google refuses")
    # Google's conformance suite requires these refused (a field given in both
    # spellings, a top-level value that is not an object, a fractional enum
    # number); the Python implementation lets them through, so only the
    # server is checked.
    canonical_only = [
        ("yadcc.scheduler.KeepTaskAliveRequest", '{"nextKeepAliveInMs": 1, "next_keep_alive_in_ms": 1}'),
        ("yadcc.scheduler.KeepTaskAliveRequest", "[]"),
        ("yadcc.scheduler.HeartbeatRequest", '{"servantPriority": 1.5}'),
    ]
    for name, text in canonical_only:
        status, _ = post(f"{args.url}/test/decode/{name}", text.encode(), "application/json")
        if status != 400:
            failures.add(f"{name}: server accepted {text}, which is not proto3 JSON")
    return len(cases) + len(canonical_only)


classes_methods = {}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="base URL of the test server")
    parser.add_argument("--descriptors", required=True, help="FileDescriptorSet file")
    parser.add_argument("--count", type=int, default=400, help="messages per type and check")
    parser.add_argument("--seed", type=int, default=None, help="replays a run (printed first)")
    parser.add_argument("--readme", required=True, help="docs/api.md, whose error table lists the answers")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    # First, so that even a crash leaves the way to replay it.
    print(f"differential: seed {seed}", flush=True)
    rng = random.Random(seed)
    with open(args.readme, encoding="utf-8") as file:
        args.outcomes = scheduler_outcomes(file.read())

    with open(args.descriptors, "rb") as file:
        descriptor_set = descriptor_pb2.FileDescriptorSet.FromString(file.read())
    pool = descriptor_pool.DescriptorPool()
    for proto in descriptor_set.file:
        pool.Add(proto)
    service = pool.FindServiceByName(SERVICE)
    classes = {"requests": {}, "responses": {}, "by_method": {}, "all": {}}
    for method in service.methods:
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        classes["requests"][method.input_type.full_name] = request
        classes["responses"][method.output_type.full_name] = response
        classes["by_method"][method.name] = (request, response)
        classes["all"][method.input_type.full_name] = request
        classes_methods[method.input_type.full_name] = method.name

    failures = Failures()
    requests = check_requests(args, rng, classes, failures)
    responses = check_responses(args, rng, classes, failures)
    live = check_live_answers(args, classes, failures)
    refusals = check_refusals(args, classes, failures)
    passed = requests + responses + live + refusals - len(failures.items)
    print(
        f"differential (seed {seed}): {requests} requests decoded as Google encoded them, "
        f"{responses} answers parsed by Google, {live} live answers compared, "
        f"{refusals} refusals compared"
    )
    print(f"{max(passed, 0)} passed, {len(failures.items)} failed")
    return 1 if failures.items else 0


if __name__ == "__main__":
    sys.exit(main())
