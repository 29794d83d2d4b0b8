"""A predict body to a `PredictRequest`, or INVALID_INPUT naming fields, never the input.

`parse_predict` parses a body in one pydantic call. That call holds the GIL for its whole
length (~100 ms for a 60 MB body), so even in a thread it would stall the event loop:
`parse_predict_sliced` does the same work a piece at a time (the body decoded in 1 MiB slices,
then the request walked one input at a time), letting go of the GIL between pieces. It
accepts and refuses what `parse_predict` does (tests/unit/test_gateway_parsing.py).
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from inference_gateway.config import MAX_INPUTS
from inference_gateway.errors import ErrorCode, GatewayError
from schemas.gateway import PredictInput, PredictRequest

# the most validation errors named in one INVALID_INPUT message
MAX_FIELD_ERRORS = 5
_DECODE_SLICE = 1 << 20
_WS = re.compile(r"[ \t\n\r]*")


def _no_constant(name: str) -> Any:
    # NaN and Infinity are not JSON; pydantic's own parser refuses them too
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
_STAND_IN = PredictInput(id="-", text="-")


def parse_predict(body: bytes) -> PredictRequest:
    """The request, or INVALID_INPUT naming the offending fields (never echoing the input:
    neither values nor the names of fields the schema does not know)."""
    try:
        return PredictRequest.model_validate_json(body)
    except ValidationError as error:
        raise invalid(_problems(error)) from None


def parse_predict_sliced(body: bytes | Sequence[bytes]) -> PredictRequest:
    """`parse_predict`, in pieces small enough that a thread running it never holds the GIL
    for long (one input, or 1 MiB of decoding, at a time). `body` may be the chunks it was
    received in."""
    try:
        text = _decode(body)
    except UnicodeDecodeError:
        raise invalid(["body: Invalid JSON: not UTF-8"]) from None
    try:
        envelope, inputs, problems = _walk(text)
    except _Invalid as error:
        raise invalid([f"body: Invalid JSON: {error}"]) from None
    if inputs is not None:
        # with bad inputs, a stand-in lets the other fields' problems be named as well
        envelope["inputs"] = inputs if not problems else [_STAND_IN]
    try:
        request = PredictRequest.model_validate(envelope)
    except ValidationError as error:
        raise invalid(problems + _problems(error)) from None
    if problems:
        raise invalid(problems)
    return request


def invalid(problems: list[str]) -> GatewayError:
    more = len(problems) - MAX_FIELD_ERRORS
    message = "; ".join(problems[:MAX_FIELD_ERRORS]) + (f"; and {more} more" if more > 0 else "")
    return GatewayError(ErrorCode.INVALID_INPUT, message)


def _problems(error: ValidationError, prefix: tuple[Any, ...] = ()) -> list[str]:
    return [
        f"{_location((*prefix, *e['loc']), e['type'])}: {e['msg']}"
        for e in error.errors(include_url=False, include_input=False)
    ]


def _location(loc: tuple[Any, ...], kind: str) -> str:
    # an unknown field's name is the caller's text (any length, any bytes): say which object
    # it was in, not what it was called
    if kind == "extra_forbidden" and loc:
        loc = (*loc[:-1], "<unknown field>")
    return ".".join(str(part) for part in loc) or "body"


def _decode(body: bytes | Sequence[bytes]) -> str:
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    chunks = [body] if isinstance(body, bytes) else body
    pieces = [
        decoder.decode(chunk[i : i + _DECODE_SLICE])
        for chunk in chunks
        for i in range(0, len(chunk), _DECODE_SLICE)
    ]
    pieces.append(decoder.decode(b"", final=True))
    return "".join(pieces)


class _Invalid(ValueError):
    pass


def _walk(text: str) -> tuple[dict[str, Any], list[PredictInput] | None, list[str]]:
    """(the other top-level fields, with `inputs` among them when it is not a list; the
    inputs validated one by one, or None; the inputs' problems)."""
    envelope: dict[str, Any] = {}
    inputs: list[PredictInput] | None = None
    problems: list[str] = []
    i = _skip(text, 0)
    if text[i : i + 1] != "{":
        raise _Invalid("expected an object")
    i = _skip(text, i + 1)
    if text[i : i + 1] == "}":
        return envelope, None, problems
    while True:
        key, i = _value(text, i)
        if not isinstance(key, str):
            raise _Invalid("expected a field name")
        i = _skip(text, i)
        if text[i : i + 1] != ":":
            raise _Invalid("expected ':'")
        i = _skip(text, i + 1)
        if key == "inputs" and text[i : i + 1] == "[":
            inputs, problems, i = _inputs(text, i)  # a repeated key: the last wins
            envelope.pop("inputs", None)
        else:
            envelope[key], i = _value(text, i)
            if key == "inputs":  # not a list: pydantic names it
                inputs, problems = None, []
        i = _skip(text, i)
        if text[i : i + 1] == "}":
            break
        if text[i : i + 1] != ",":
            raise _Invalid("expected ',' or '}'")
        i = _skip(text, i + 1)
    if _skip(text, i + 1) != len(text):
        raise _Invalid("trailing characters")
    return envelope, inputs, problems


def _inputs(text: str, i: int) -> tuple[list[PredictInput], list[str], int]:
    inputs: list[PredictInput] = []
    problems: list[str] = []
    i = _skip(text, i + 1)
    if text[i : i + 1] == "]":
        return inputs, problems, i + 1
    n = 0
    while True:
        if n == MAX_INPUTS:
            # as pydantic words it; the rest is not even parsed
            raise invalid([f"inputs: List should have at most {MAX_INPUTS} items"])
        item, i = _value(text, i)
        try:
            inputs.append(PredictInput.model_validate(item))
        except ValidationError as error:
            problems.extend(_problems(error, ("inputs", n)))
        n += 1
        i = _skip(text, i)
        if text[i : i + 1] == "]":
            return inputs, problems, i + 1
        if text[i : i + 1] != ",":
            raise _Invalid("expected ',' or ']'")
        i = _skip(text, i + 1)


def _value(text: str, i: int) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, i)
    except json.JSONDecodeError as error:
        raise _Invalid(f"{error.msg} at character {error.pos}") from None
    except ValueError as error:  # NaN, Infinity
        raise _Invalid(str(error)) from None


def _skip(text: str, i: int) -> int:
    match = _WS.match(text, i)
    return match.end() if match else i
