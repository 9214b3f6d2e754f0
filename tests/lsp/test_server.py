"""``kvpolicy lsp`` over a real pipe: a subprocess, JSON-RPC on its stdin and stdout."""

from __future__ import annotations

import json
from pathlib import Path

from lsprotocol import types

from kvpolicy.lsp.language import RULES_DOC_URL as RULES_DOC
from kvpolicy.policy.fmt import format_text
from tests.lsp.client import LspClient

THREE_MISTAKES = """\
version 1

model "qwen3-8b" {
  engine vllm
  reserve 4 GiBB
  priority 10
}

model "qwen3-*" {
  enigne vllm
  priority 5; reserve 8 GiB
}

rule "idle-reclaim" {
  when gpu.free < 8 GiB and model.idle > 5m
  order priority asc, idle desc
  shrink to min
  grace 30
}
"""

FACTS = {
    "schema": 1,
    "gpus": [{"id": "cuda:0", "capacity": 150 * 2**30}],
    "instances": [
        {"id": "chat/0", "model": "qwen3-8b", "engine": "vllm", "gpu": "cuda:0"},
        {"id": "coder/0", "model": "qwen3-coder", "engine": "vllm", "gpu": "cuda:0"},
        {"id": "llama/0", "model": "llama-3", "engine": "vllm", "gpu": "cuda:0"},
    ],
}


def at(line: int, character: int) -> types.Position:
    return types.Position(line=line, character=character)


def span(line: int, start: int, end: int) -> types.Range:
    return types.Range(start=at(line, start), end=at(line, end))


def doc_id(uri: str) -> types.TextDocumentIdentifier:
    return types.TextDocumentIdentifier(uri=uri)


def apply_edits(text: str, edits: list[types.TextEdit]) -> str:
    """``edits`` applied as an editor does (positions are UTF-16 units; these texts are ASCII)."""
    lines = text.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)

    def offset(p: types.Position) -> int:
        return min(starts[p.line] + p.character, len(text))

    for edit in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True):
        text = text[: offset(edit.range.start)] + edit.new_text + text[offset(edit.range.end) :]
    return text


def opened(client: LspClient, tmp_path: Path, text: str, name: str = "policy.kvp", **init) -> tuple[str, list[types.Diagnostic]]:
    client.initialize(tmp_path, **init)
    path = tmp_path / name
    path.write_text(text)
    uri = client.open(path, text)
    return uri, client.diagnostics(uri, version=1)


# ---- diagnostics --------------------------------------------------------------------------


def test_three_mistakes_are_reported_where_they_are_and_go_when_fixed(client: LspClient, tmp_path: Path) -> None:
    uri, diagnostics = opened(client, tmp_path, THREE_MISTAKES)
    assert [(d.code, d.range, d.severity) for d in diagnostics] == [
        ("KV001", span(4, 12, 16), types.DiagnosticSeverity.Error),
        ("KV004", span(9, 2, 8), types.DiagnosticSeverity.Error),
        ("KV005", span(17, 8, 10), types.DiagnosticSeverity.Error),
    ]
    assert [d.code_description.href for d in diagnostics] == [
        f"{RULES_DOC}#kv001-unknown-unit", f"{RULES_DOC}#kv004-unknown-field", f"{RULES_DOC}#kv005-invalid-duration",
    ]
    assert all(d.source == "kvpolicy" for d in diagnostics)
    assert diagnostics[0].message == "unknown unit 'GiBB'\nhint: did you mean 'GiB'?"

    # Incremental edits, as an editor sends them while the user types.
    client.change(uri, 2, [types.TextDocumentContentChangePartial(range=span(4, 15, 16), text="")])
    assert [d.code for d in client.diagnostics(uri, version=2)] == ["KV004", "KV005"]
    client.change(uri, 3, [
        types.TextDocumentContentChangePartial(range=span(9, 2, 8), text="engine"),
        types.TextDocumentContentChangePartial(range=span(17, 10, 10), text="s"),
    ])
    assert client.diagnostics(uri, version=3) == []
    assert client.shutdown() == 0


def test_syntax_errors_recover_so_each_is_reported(client: LspClient, tmp_path: Path) -> None:
    text = 'version 1\nmodel "a" {\n  priority\n  reserve 4 GiB\n}\nmodel "b" {\n  reserve 4 GiB )\n}\n'
    _, diagnostics = opened(client, tmp_path, text)
    assert [(d.code, d.range.start.line) for d in diagnostics] == [("KV002", 2), ("KV002", 6)]


def test_positions_count_the_clients_utf16_units(client: LspClient, tmp_path: Path) -> None:
    # U+1F600 is two UTF-16 units: everything after it on the line moves one unit right.
    text = 'version 1\nmodel "\U0001F600" { priority 5; reserve 4 GiBB }\n'
    uri, diagnostics = opened(client, tmp_path, text)
    line = text.split("\n")[1]
    unit, keyword = line.index("GiBB"), line.index("priority")
    assert [(d.code, d.range) for d in diagnostics] == [("KV001", span(1, unit + 1, unit + 5))]
    hover = client.request("textDocument/hover", types.HoverParams(text_document=doc_id(uri), position=at(1, keyword + 2)))
    assert hover.range == span(1, keyword + 1, keyword + 9)
    assert "| `priority` |" in hover.contents.value


def test_gpu_capacity_setting_checks_over_commitment(tmp_path: Path) -> None:
    text = 'version 1\nmodel "a" { reserve 100 GiB }\nmodel "b" { reserve 60 GiB }\n'
    client = LspClient(settings={"kvpolicy.gpuCapacity": "141GiB"})
    try:
        _, diagnostics = opened(client, tmp_path, text)
        assert client.configuration_requests == [["kvpolicy.facts", "kvpolicy.gpuCapacity"]]
        # the first lint may run before the settings arrive; the one after them has the finding
        if not any(d.code == "KV017" for d in diagnostics):
            diagnostics = client.wait_for("textDocument/publishDiagnostics", lambda p: any(d.code == "KV017" for d in p.diagnostics)).diagnostics
        assert [(d.code, d.range.start.line) for d in diagnostics] == [("KV017", 2)]
        assert "capacity 141 GiB" in diagnostics[0].message
    finally:
        client.close()


def test_facts_beside_the_policy_are_the_context(client: LspClient, tmp_path: Path) -> None:
    facts = {**FACTS, "gpus": [{"id": "cuda:0", "capacity": 100 * 2**30}]}
    (tmp_path / "policy.facts.json").write_text(json.dumps(facts))
    text = 'version 1\nmodel "qwen3-8b" { reserve 60 GiB }\nmodel "llama-*" { reserve 50 GiB }\n'
    _, diagnostics = opened(client, tmp_path, text)
    assert [(d.code, d.range.start.line) for d in diagnostics] == [("KV017", 2)]
    assert "cuda:0" in diagnostics[0].message


def test_policy_capacity_is_the_context_without_facts_or_settings(client: LspClient, tmp_path: Path) -> None:
    text = 'version 1\ngpu * { capacity 80 GiB }\nmodel "a" { reserve 50 GiB }\nmodel "b" { reserve 40 GiB }\n'
    _, diagnostics = opened(client, tmp_path, text, configuration=False)
    assert [(d.code, d.range.start.line) for d in diagnostics] == [("KV017", 3)]


def test_initialization_options_are_settings_for_clients_without_configuration(client: LspClient, tmp_path: Path) -> None:
    text = 'version 1\nmodel "a" { reserve 100 GiB }\nmodel "b" { reserve 60 GiB }\n'
    _, diagnostics = opened(client, tmp_path, text, configuration=False,
                            initialization_options={"kvpolicy": {"gpuCapacity": "141GiB"}})
    assert client.configuration_requests == []
    assert [d.code for d in diagnostics] == ["KV017"]


def test_settings_pushed_by_the_client_take_effect(client: LspClient, tmp_path: Path) -> None:
    text = 'version 1\nmodel "a" { reserve 100 GiB }\nmodel "b" { reserve 60 GiB }\n'
    uri, diagnostics = opened(client, tmp_path, text)
    assert diagnostics == []
    client.notify("workspace/didChangeConfiguration", types.DidChangeConfigurationParams(
        settings={"kvpolicy": {"gpuCapacity": "141GiB"}}))
    assert [d.code for d in client.diagnostics(uri, version=1)] == ["KV017"]


def test_closing_a_policy_clears_its_diagnostics(client: LspClient, tmp_path: Path) -> None:
    uri, diagnostics = opened(client, tmp_path, THREE_MISTAKES)
    assert len(diagnostics) == 3
    client.notify("textDocument/didClose", types.DidCloseTextDocumentParams(text_document=doc_id(uri)))
    cleared = client.wait_for("textDocument/publishDiagnostics", lambda p: p.uri == uri and p.version is None)
    assert list(cleared.diagnostics) == []


# ---- hover -------------------------------------------------------------------------------------

HOVERED = """\
version 1

gpu * {
  headroom 2 GiB
}

model "qwen3-8b" {
  engine vllm
  max 40%
  pool full { owner elastic; max 20 GiB }
}

model "qwen3-*" {
  priority 5
}

# kvpolicy: ignore[KV020] acts at once on purpose
rule "r" { when gpu.free < 8 GiB; shrink to min }
"""


def hover_text(client: LspClient, uri: str, line: int, character: int) -> str | None:
    result = client.request("textDocument/hover", types.HoverParams(text_document=doc_id(uri), position=at(line, character)))
    return None if result is None else result.contents.value


def test_hover(client: LspClient, tmp_path: Path) -> None:
    (tmp_path / "policy.facts.json").write_text(json.dumps(FACTS))
    uri, diagnostics = opened(client, tmp_path, HOVERED)
    assert diagnostics == []
    # keywords: the reference's line, the one for the block the cursor is in
    headroom = hover_text(client, uri, 3, 4)
    assert "| `headroom` | size or percentage |" in headroom and "defaults and gpu" in headroom
    model_max = hover_text(client, uri, 8, 3)
    assert "| `max` | size or percentage | `100%` | elastic cap |" in model_max
    pool_max = hover_text(client, uri, 9, 30)
    assert "a runtime-owned pool reporting more is a violation" in pool_max and "elastic cap" not in pool_max
    assert "model.free" not in (hover_text(client, uri, 17, 18) or "") and "`gpu.free`" in hover_text(client, uri, 17, 18)
    # sizes and percentages
    assert "2,147,483,648 bytes = 2 GiB" in hover_text(client, uri, 3, 12)
    percent = hover_text(client, uri, 8, 7)
    assert "cuda:0: 64,424,509,440 bytes = 60 GiB (of 150 GiB)" in percent
    # a lint code in a suppression comment
    code = hover_text(client, uri, 16, 20)
    assert code.startswith("**KV020 rule-without-grace** · warning · suppressible")
    assert f"{RULES_DOC}#kv020-rule-without-grace" in code
    # model patterns: which instances they bind
    exact = hover_text(client, uri, 6, 9)
    assert "`chat/0` (qwen3-8b, vllm, cuda:0): binds here" in exact
    glob = hover_text(client, uri, 12, 9)
    assert "`coder/0` (qwen3-coder, vllm, cuda:0): binds here" in glob
    assert '`chat/0` (qwen3-8b, vllm, cuda:0): matches, but `model "qwen3-8b"` (line 7) is more specific' in glob
    assert "llama" not in glob
    # nothing to say on a brace
    assert hover_text(client, uri, 11, 0) is None


# ---- completion ----------------------------------------------------------------------------


def labels(client: LspClient, uri: str, line: int, character: int) -> list[str]:
    result = client.request("textDocument/completion", types.CompletionParams(text_document=doc_id(uri), position=at(line, character)))
    return [item.label for item in result.items]


COMPLETED = """\
version 1
model "v4" {
  engine sglang
  reserve 40
  pool c4 { owner runtime }
  pool 
}
rule "r" {
  when gpu.free < 8 GiB and 
  order priority asc, 
  shrink to 
  grace 30
}
# kvpolicy: ignore[
"""  # noqa: W291 - the trailing spaces are where the completions are asked for


def test_completion(client: LspClient, tmp_path: Path) -> None:
    uri, _ = opened(client, tmp_path, COMPLETED)
    # statement keywords valid here: engine and reserve are written already
    assert labels(client, uri, 5, 0) == ["priority", "min", "max", "weight", "pool"]
    assert labels(client, uri, 7, 0) == ["defaults", "gpu", "model", "rule"]  # version is there already
    # units after a number: reserve takes sizes, not percentages; grace takes durations
    assert labels(client, uri, 3, 12) == ["B", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB"]
    assert labels(client, uri, 11, 10) == ["ms", "s", "m", "h"]
    # pool names of the model's engine, not those already written
    assert labels(client, uri, 5, 7) == ["c128", "compressor_state", "indexer", "other", "req_to_token", "swa"]
    # attributes in `when`, order keys, rule actions
    when = labels(client, uri, 8, 28)
    assert {"gpu.free", "model.idle", "model.priority"} <= set(when) and "not" in when
    assert labels(client, uri, 9, 22) == ["used", "waiting", "idle", "priority", "weight", "min", "max", "target", "engine", "name"]
    assert labels(client, uri, 10, 12) == ["min", "target"]
    # codes that a suppression may name (KV001 cannot be suppressed)
    codes = labels(client, uri, 13, 19)
    assert {"KV017", "KV019", "KV020", "KV021", "KV022", "KV028", "KV029", "KV030"} == set(codes)


def test_completion_replaces_the_word_being_typed(client: LspClient, tmp_path: Path) -> None:
    uri, _ = opened(client, tmp_path, 'version 1\nmodel "a" { reserve 4Gi }\nrule "r" { when gpu.fr }\n')
    result = client.request("textDocument/completion", types.CompletionParams(text_document=doc_id(uri), position=at(1, 23)))
    gib = next(i for i in result.items if i.label == "GiB")
    assert gib.text_edit.range == span(1, 21, 23)
    result = client.request("textDocument/completion", types.CompletionParams(text_document=doc_id(uri), position=at(2, 22)))
    free = next(i for i in result.items if i.label == "gpu.free")
    assert free.text_edit.range == span(2, 16, 22) and free.kind == types.CompletionItemKind.Property


# ---- formatting ------------------------------------------------------------------------------


def test_formatting_gives_the_formatters_output_as_edits(client: LspClient, tmp_path: Path) -> None:
    text = 'version 1\n\n\nmodel "a" {\n    reserve 4GiB  # keep me\n  priority   10\n}\nrule "r" { when gpu.free<8GiB; shrink to min; grace 30s }\n'
    uri, _ = opened(client, tmp_path, text)
    options = types.FormattingOptions(tab_size=2, insert_spaces=True)
    edits = client.request("textDocument/formatting", types.DocumentFormattingParams(text_document=doc_id(uri), options=options))
    assert edits and apply_edits(text, edits) == format_text(text)
    # only the lines that change are replaced: the first line is not touched
    assert all(e.range.start.line >= 1 for e in edits)


def test_formatting_refuses_a_syntax_error_with_a_message(client: LspClient, tmp_path: Path) -> None:
    uri, _ = opened(client, tmp_path, 'version 1\nmodel "a" {\n  priority\n}\n')
    options = types.FormattingOptions(tab_size=2, insert_spaces=True)
    edits = client.request("textDocument/formatting", types.DocumentFormattingParams(text_document=doc_id(uri), options=options))
    assert edits is None
    message = client.wait_for("window/showMessage")
    assert message.type == types.MessageType.Warning
    assert message.message.startswith("kvpolicy: not formatted: line 3:11:")


# ---- code actions ------------------------------------------------------------------------------


def code_actions(client: LspClient, uri: str, diagnostics: list[types.Diagnostic], rng: types.Range) -> list[types.CodeAction]:
    return client.request("textDocument/codeAction", types.CodeActionParams(
        text_document=doc_id(uri), range=rng, context=types.CodeActionContext(diagnostics=diagnostics),
    ))


def test_code_actions_fix_what_the_hints_say(client: LspClient, tmp_path: Path) -> None:
    uri, diagnostics = opened(client, tmp_path, THREE_MISTAKES)
    unit = code_actions(client, uri, diagnostics[:1], diagnostics[0].range)
    titles = [a.title for a in unit]
    assert titles == ["Change 'GiBB' to 'GiB'"]  # KV001 cannot be suppressed
    assert unit[0].is_preferred and unit[0].kind == types.CodeActionKind.QuickFix
    assert list(unit[0].edit.changes[uri]) == [types.TextEdit(range=span(4, 12, 16), new_text="GiB")]
    grace = code_actions(client, uri, diagnostics[2:], diagnostics[2].range)
    assert [a.title for a in grace] == ["Change `grace 30` to `grace 30s`"]
    fixed = THREE_MISTAKES
    for action in (unit[0], grace[0], code_actions(client, uri, diagnostics[1:2], diagnostics[1].range)[0]):
        fixed = apply_edits(fixed, action.edit.changes[uri])
    client.change(uri, 2, [types.TextDocumentContentChangeWholeDocument(text=fixed)])
    assert client.diagnostics(uri, version=2) == []


def test_code_actions_add_the_version_and_suppressions(client: LspClient, tmp_path: Path) -> None:
    text = '# the fleet policy\nmodel "a" { reserve 40 GB }\n'
    uri, diagnostics = opened(client, tmp_path, text)
    assert [d.code for d in diagnostics] == ["KV003", "KV019"]
    version = code_actions(client, uri, diagnostics[:1], diagnostics[0].range)
    assert [a.title for a in version] == ["Add `version 1`"]
    fixed = apply_edits(text, version[0].edit.changes[uri])
    assert fixed == '# the fleet policy\nversion 1\nmodel "a" { reserve 40 GB }\n'
    client.change(uri, 2, [types.TextDocumentContentChangeWholeDocument(text=fixed)])
    diagnostics = client.diagnostics(uri, version=2)
    assert [d.code for d in diagnostics] == ["KV019"]
    actions = code_actions(client, uri, diagnostics, diagnostics[0].range)
    assert [a.title for a in actions] == ["Change 'GB' to 'GiB'", "Suppress KV019 (decimal-unit) on this line"]
    suppressed = apply_edits(fixed, actions[1].edit.changes[uri])
    assert suppressed.split("\n")[2] == 'model "a" { reserve 40 GB }  # kvpolicy: ignore[KV019] TODO: say why'
    client.change(uri, 3, [types.TextDocumentContentChangeWholeDocument(text=suppressed)])
    assert client.diagnostics(uri, version=3) == []


def test_code_action_ends_a_shrink_on_low_use_when_work_waits(client: LspClient, tmp_path: Path) -> None:
    text = 'version 1\nmodel "a" { min 4 GiB }\nrule "r" {\n  when model.used < 3 GiB\n  shrink to min\n  grace 3s\n}\n'
    uri, diagnostics = opened(client, tmp_path, text)
    assert [d.code for d in diagnostics] == ["KV030"]
    actions = code_actions(client, uri, diagnostics, diagnostics[0].range)
    assert [a.title for a in actions] == [
        "Change `model.used < 3 GiB` to `model.used < 3 GiB and model.waiting == 0`",
        "Suppress KV030 (shrink-on-low-use) on this line",
    ]
    fixed = apply_edits(text, actions[0].edit.changes[uri])
    assert fixed.split("\n")[3] == "  when model.used < 3 GiB and model.waiting == 0"
    client.change(uri, 2, [types.TextDocumentContentChangeWholeDocument(text=fixed)])
    assert client.diagnostics(uri, version=2) == []


# ---- navigation from .kvtest.json ---------------------------------------------------------------

NAVIGATED = """\
version 1

model "qwen3-8b" {
  priority 10
  pool full { owner elastic }
}

model "qwen3-*" {
  priority 5
}

rule "idle-reclaim" {
  when model.idle > 5m
  shrink to min
  grace 30s
}
"""

KVTEST = """\
{"schema": 1, "policy": "policy.kvp",
 "cases": [
   {"name": "coder is shrunk",
    "facts": "policy.facts.json",
    "expect": {"instances": {"coder/0": {"actions": ["idle-reclaim"]},
                             "chat/0": {"violations": ["pool_over_max:full"]}}}},
   {"name": "inline",
    "facts": {"gpus": [{"id": "cuda:0", "capacity": 1000}],
              "instances": [{"id": "x/0", "model": "qwen3-8b", "gpu": "cuda:0"}]},
    "steps": [{"advance": 1, "expect": {"instances": {"x/0": {"actions": ["idle-reclaim"]}}}}]}]}
"""


def position_of(text: str, needle: str, nth: int = 0) -> types.Position:
    index = -1
    for _ in range(nth + 1):
        index = text.index(needle, index + 1)
    line = text.count("\n", 0, index)
    return at(line, index - (text.rfind("\n", 0, index) + 1) + 1)


def test_definition_and_references_from_a_kvtest(client: LspClient, tmp_path: Path) -> None:
    (tmp_path / "policy.facts.json").write_text(json.dumps(FACTS))
    policy_uri, _ = opened(client, tmp_path, NAVIGATED)
    test_path = tmp_path / "policy.kvtest.json"
    test_path.write_text(KVTEST)
    test_uri = client.open(test_path, KVTEST, language="json")

    def definition(needle: str, nth: int = 0) -> list[types.Location] | None:
        found = client.request("textDocument/definition", types.DefinitionParams(
            text_document=doc_id(test_uri), position=position_of(KVTEST, needle, nth)))
        return None if found is None else list(found)

    glob_header = types.Location(uri=policy_uri, range=span(7, 0, 15))
    exact_header = types.Location(uri=policy_uri, range=span(2, 0, 16))
    rule_header = types.Location(uri=policy_uri, range=span(11, 0, 19))
    assert definition('"coder/0"') == [glob_header]  # qwen3-coder binds the glob
    assert definition('"chat/0"') == [exact_header]  # qwen3-8b binds the exact name
    assert definition('"idle-reclaim"') == [rule_header]
    assert definition('"pool_over_max:full"') == [types.Location(uri=policy_uri, range=span(4, 2, 11))]
    assert definition('"qwen3-8b"') == [exact_header]  # a model in inline facts
    assert definition('"policy.kvp"') == [types.Location(uri=policy_uri, range=span(0, 0, 0))]
    assert definition('"policy.facts.json"') == [types.Location(uri=(tmp_path / "policy.facts.json").as_uri(), range=span(0, 0, 0))]
    assert definition('"coder is shrunk"') is None

    # references: from the rule in the policy to each test that names it
    refs = client.request("textDocument/references", types.ReferenceParams(
        text_document=doc_id(policy_uri), position=at(11, 8), context=types.ReferenceContext(include_declaration=True)))
    first, second = position_of(KVTEST, '"idle-reclaim"'), position_of(KVTEST, '"idle-reclaim"', 1)
    assert list(refs) == [
        rule_header,
        types.Location(uri=test_uri, range=span(first.line, first.character - 1, first.character + 13)),
        types.Location(uri=test_uri, range=span(second.line, second.character - 1, second.character + 13)),
    ]
    # and from an instance in the test to the tests that bind the same model block
    refs = client.request("textDocument/references", types.ReferenceParams(
        text_document=doc_id(test_uri), position=position_of(KVTEST, '"chat/0"'),
        context=types.ReferenceContext(include_declaration=False)))
    # chat/0 itself, the inline facts' instance of qwen3-8b, and x/0 (that instance) in its step
    assert [r.range.start.line for r in refs] == [5, 8, 9]


# ---- the command ------------------------------------------------------------------------------


def test_exit_without_shutdown_is_an_error(client: LspClient, tmp_path: Path) -> None:
    client.initialize(tmp_path)
    client.notify("exit", None)
    assert client.process.wait(timeout=60) == 1
