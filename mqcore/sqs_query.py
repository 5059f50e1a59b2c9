"""SQS's query protocol (form-encoded ``Action=...``, XML answers): older SDKs' wire format (docs/sqs.md).

The same actions as the AWS JSON 1.0 protocol (``mqcore.sqs``, ``daemons/_sqs.py``): a query
request is translated into the JSON request shape, run by the same action, and its JSON result
rendered as the query protocol's XML. Only the shapes differ: flattened, 1-based lists
(``Attribute.1.Name``, ``SendMessageBatchRequestEntry.2.Id``) and XML element names from the
SQS API reference (2012-11-05).

Pure code: no I/O, no HTTP.
"""

from __future__ import annotations

import re
from typing import Any
from xml.sax.saxutils import escape

from mqcore.sqs import SqsError

XMLNS = "http://queue.amazonaws.com/doc/2012-11-05/"

#: Request fields that are integers on the JSON side.
_INT_FIELDS = {
    "DelaySeconds",
    "MaxNumberOfMessages",
    "VisibilityTimeout",
    "WaitTimeSeconds",
    "MaxResults",
    "MaxNumberOfMessagesPerSecond",
}
#: Query list prefix -> JSON list field (lists of strings).
_STRING_LISTS = {
    "AttributeName": "AttributeNames",
    "MessageSystemAttributeName": "MessageSystemAttributeNames",
    "MessageAttributeName": "MessageAttributeNames",
    "TagKey": "TagKeys",
}
#: Query batch entry prefix -> JSON list field.
_ENTRY_LISTS = {
    "SendMessageBatchRequestEntry": "Entries",
    "DeleteMessageBatchRequestEntry": "Entries",
    "ChangeMessageVisibilityBatchRequestEntry": "Entries",
}
_INDEXED = re.compile(r"([A-Za-z]+)\.([0-9]+)(?:\.(.+))?")


def _number(name: str, value: str) -> Any:
    if name in _INT_FIELDS:
        try:
            return int(value)
        except ValueError:
            raise SqsError("InvalidParameterValue", f"Value {value!r} for parameter {name} is invalid.") from None
    return value


def _fields(params: dict[str, str]) -> dict[str, Any]:
    """Flattened query parameters of one level as the JSON request shape."""
    out: dict[str, Any] = {}
    groups: dict[str, dict[int, dict[str, str] | str]] = {}
    for key, value in params.items():
        match = _INDEXED.fullmatch(key)
        if match is None:
            out[key] = _number(key, value)
            continue
        prefix, index, rest = match[1], int(match[2]), match[3]
        group = groups.setdefault(prefix, {})
        if rest is None:
            group[index] = value
        else:
            item = group.setdefault(index, {})
            if isinstance(item, dict):
                item[rest] = value
    for prefix, group in groups.items():
        items = [group[i] for i in sorted(group)]
        if prefix in _STRING_LISTS:
            out[_STRING_LISTS[prefix]] = [i for i in items if isinstance(i, str)]
        elif prefix == "Attribute":
            out["Attributes"] = {i["Name"]: i.get("Value", "") for i in items if isinstance(i, dict) and "Name" in i}
        elif prefix == "Tag":
            out["tags"] = {i["Key"]: i.get("Value", "") for i in items if isinstance(i, dict) and "Key" in i}
        elif prefix in ("MessageAttribute", "MessageSystemAttribute"):
            attributes: dict[str, Any] = {}
            for item in items:
                if isinstance(item, dict) and "Name" in item:
                    typed: dict[str, str] = {}
                    for field in ("DataType", "StringValue", "BinaryValue"):
                        if f"Value.{field}" in item:
                            typed[field] = item[f"Value.{field}"]
                    attributes[item["Name"]] = typed
            out[f"{prefix}s"] = attributes
        elif prefix in _ENTRY_LISTS:
            out[_ENTRY_LISTS[prefix]] = [_fields(i) for i in items if isinstance(i, dict)]
        else:
            raise SqsError("InvalidParameterValue", f"Unknown parameter {prefix}.N.")
    return out


def parse_request(params: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """A query request's ``(action, JSON-shaped request)``.

    ``Version``, ``AWSAccessKeyId``, ``Signature*``, ``Timestamp`` and ``Expires`` are dropped.

    Raises:
        SqsError: MissingParameter (no Action), InvalidParameterValue (unknown list parameter, bad integer).
    """
    action = params.get("Action")
    if not action:
        raise SqsError("MissingParameter", "The request must contain the parameter Action.")
    skip = (
        "Action",
        "Version",
        "AWSAccessKeyId",
        "SignatureMethod",
        "SignatureVersion",
        "Signature",
        "Timestamp",
        "Expires",
    )
    request = _fields({k: v for k, v in params.items() if k not in skip})
    if action == "TagQueue" and "tags" in request:
        request["Tags"] = request.pop("tags")  # CreateQueue's JSON field is "tags", TagQueue's "Tags"
    return action, request


def _element(name: str, value: Any) -> str:
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return f"<{name}>{escape(text)}</{name}>"


def _attributes(values: dict[str, str], element: str = "Attribute") -> str:
    return "".join(f"<{element}>{_element('Name', k)}{_element('Value', v)}</{element}>" for k, v in values.items())


def _message(message: dict[str, Any]) -> str:
    out = "".join(_element(k, message[k]) for k in ("MessageId", "ReceiptHandle", "MD5OfBody", "Body") if k in message)
    out += _attributes(message.get("Attributes", {}))
    if "MD5OfMessageAttributes" in message:
        out += _element("MD5OfMessageAttributes", message["MD5OfMessageAttributes"])
    for name, value in message.get("MessageAttributes", {}).items():
        inner = "".join(_element(k, value[k]) for k in ("StringValue", "BinaryValue", "DataType") if k in value)
        out += f"<MessageAttribute>{_element('Name', name)}<Value>{inner}</Value></MessageAttribute>"
    return f"<Message>{out}</Message>"


def _entries(action: str, result: dict[str, Any]) -> str:
    name = f"{action}ResultEntry"
    out = ""
    for entry in result.get("Successful", []):
        out += f"<{name}>" + "".join(_element(k, v) for k, v in entry.items()) + f"</{name}>"
    for entry in result.get("Failed", []):
        out += "<BatchResultErrorEntry>" + "".join(_element(k, v) for k, v in entry.items())
        out += "</BatchResultErrorEntry>"
    return out


def render_result(action: str, result: dict[str, Any], request_id: str) -> bytes:
    """The query protocol's XML answer for an action's JSON ``result``."""
    body = ""
    if action in ("SendMessageBatch", "DeleteMessageBatch", "ChangeMessageVisibilityBatch"):
        body = _entries(action, result)
    else:
        for key, value in result.items():
            if key == "Messages":
                body += "".join(_message(m) for m in value)
            elif key in ("QueueUrls", "queueUrls"):
                body += "".join(_element("QueueUrl", u) for u in value)
            elif key == "Attributes":
                body += _attributes(value)
            elif key == "Tags":
                body += "".join(f"<Tag>{_element('Key', k)}{_element('Value', v)}</Tag>" for k, v in value.items())
            elif key == "Results":
                for entry in value:
                    inner = "".join(_element(k, v) for k, v in entry.items())
                    body += f"<ListMessageMoveTasksResultEntry>{inner}</ListMessageMoveTasksResultEntry>"
            else:
                body += _element(key, value)
    return (
        f'<?xml version="1.0"?><{action}Response xmlns="{XMLNS}"><{action}Result>{body}</{action}Result>'
        f"<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata></{action}Response>"
    ).encode()


def render_error(error: SqsError, request_id: str) -> bytes:
    """The query protocol's XML error: ``<ErrorResponse><Error><Type><Code><Message>`` (Code: the legacy code)."""
    code, kind = error.query_error.split(";")
    return (
        f'<?xml version="1.0"?><ErrorResponse xmlns="{XMLNS}"><Error>{_element("Type", kind)}'
        f"{_element('Code', code)}{_element('Message', error.message)}<Detail/></Error>"
        f"<RequestId>{request_id}</RequestId></ErrorResponse>"
    ).encode()
