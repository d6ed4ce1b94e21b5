"""Tests of environments/host/parsers.py on hand-written cases and random strings."""

import hypothesis
from hypothesis import strategies as st

from environments.host import parsers
from environments.host.parsers import ParseError, ToolCall


def test_hermes_tags_one_and_two_calls():
  text = (
      'thinking...<tool_call>{"name": "get_weather", "arguments": '
      '{"city": "Paris", "days": 3}}</tool_call>'
  )
  assert parsers.parse_tool_calls(text) == [
      ToolCall("get_weather", {"city": "Paris", "days": 3})
  ]
  two = (
      '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
      '<tool_call>{"name": "b", "arguments": {"x": [1, 2]}}</tool_call>'
  )
  assert parsers.parse_tool_calls(two) == [
      ToolCall("a", {}),
      ToolCall("b", {"x": [1, 2]}),
  ]


def test_hermes_unclosed_tag_and_string_arguments():
  text = '<tool_call>{"name": "f", "arguments": "{\\"k\\": 1.5}"}'
  assert parsers.parse_tool_calls(text) == [ToolCall("f", {"k": 1.5})]


def test_byte_tokenizer_call_tags():
  assert parsers.parse_tool_calls("<call>calc(expr='2+2')</call>") == [
      ToolCall("calc", {"expr": "2+2"})
  ]


def test_bare_json_object_list_and_bfcl_style():
  assert parsers.parse_tool_calls(
      '{"name": "f", "parameters": {"a": null}}'
  ) == [ToolCall("f", {"a": None})]
  assert parsers.parse_tool_calls('[{"f": {"a": 1}}, {"g": {}}]') == [
      ToolCall("f", {"a": 1}),
      ToolCall("g", {}),
  ]
  assert parsers.parse_tool_calls(
      '```json\n{"name": "f", "arguments": {}}\n```'
  ) == [ToolCall("f", {})]


def test_python_call_syntax_literals_only():
  assert parsers.parse_tool_calls(
      'math.hypot(x=4, y=-5.5, z=[1, (2, 3)], d={"k": True})'
  ) == [
      ToolCall(
          "math.hypot", {"x": 4, "y": -5.5, "z": [1, [2, 3]], "d": {"k": True}}
      )
  ]
  assert parsers.parse_tool_calls("[f(a=1), g(b='x')]") == [
      ToolCall("f", {"a": 1}),
      ToolCall("g", {"b": "x"}),
  ]


def test_unsafe_or_malformed_python_is_refused_not_evaluated():
  for text in (
      "f(a=__import__('os').system('echo hi'))",
      "f(1, 2)",
      "f(**k)",
      "f(a=x)",
      "f(a=1+2)",
      "lambda: 0",
      "f(a=1",
      "",
  ):
    out = parsers.parse_tool_calls(text)
    assert isinstance(out, ParseError), (text, out)


def test_malformed_tag_payload_is_a_parse_error():
  out = parsers.parse_tool_calls(
      '<tool_call>{"name": "f", "arguments": [1]}</tool_call>'
  )
  assert isinstance(out, ParseError) and "malformed <tool_call>" in out.reason


def test_non_string_and_oversized_inputs():
  assert isinstance(parsers.parse_tool_calls(None), ParseError)
  assert isinstance(parsers.parse_tool_calls(b"f(a=1)"), ParseError)
  big = "f(a=" + "[" * 50_000 + "]" * 50_000 + ")"
  assert isinstance(parsers.parse_tool_calls(big), ParseError)
  deep = "f(a=" + "[" * 5000 + "]" * 5000 + ")"  # RecursionError inside ast
  assert isinstance(parsers.parse_tool_calls(deep), (ParseError, list))


def test_formatters_round_trip():
  call = ToolCall(
      "ns.f", {"a": 1, "b": "x y", "c": [1.5, None], "d": {"e": False}}
  )
  assert parsers.parse_tool_calls(parsers.format_call_python(call)) == [call]
  assert parsers.parse_tool_calls(parsers.format_call_hermes(call)) == [call]


_FRAGMENTS = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<call>",
        "</call>",
        "{",
        "}",
        "[",
        "]",
        "(",
        ")",
        '"name"',
        '"arguments"',
        ":",
        ",",
        "=",
        "f",
        "a",
        "1",
        "-",
        "'",
        '"',
        "\\",
        "\x00",
        "```",
        "json",
        " ",
        "\n",
        "None",
        "True",
        "**",
        "lambda",
        ".",
        "1e999",
    ]
)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(
    st.one_of(
        st.text(max_size=200), st.lists(_FRAGMENTS, max_size=40).map("".join)
    )
)
def test_random_strings_never_raise(text):
  out = parsers.parse_tool_calls(text)
  assert isinstance(out, (ParseError, list))
  if isinstance(out, list):
    assert out and all(
        isinstance(c, ToolCall)
        and isinstance(c.name, str)
        and isinstance(c.arguments, dict)
        for c in out
    )


def test_python_calls_with_positional_arguments():
  assert parsers.parse_python_calls("sort('f.pdf')", allow_positional=True) == [
      ToolCall("sort", {}, ("f.pdf",))
  ]
  assert isinstance(parsers.parse_python_calls("sort('f.pdf')"), ParseError)
  assert isinstance(parsers.parse_tool_calls("sort('f.pdf')"), ParseError)
  assert isinstance(
      parsers.parse_python_calls("f(*a)", allow_positional=True), ParseError
  )
