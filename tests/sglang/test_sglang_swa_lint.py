"""The policy language's view of DeepSeek-V4 on SGLang: `swa` may be elastic, its other pools may not."""

from __future__ import annotations

import pytest

from kvpolicy.engines import DEEPSEEK_V4_POOLS, ENGINES, RUNTIME_OWNED_WHY
from kvpolicy.lint.engine import lint_text


def codes(text: str) -> list[tuple[str, int, str, str]]:
    result = lint_text("version 1\n" + text, "p.kvp")
    return [(d.code, d.line, d.message, d.hint or "") for d in result.diagnostics]


def test_the_vocabulary_lists_swa_as_sglangs_one_elastic_pool() -> None:
    assert ENGINES["sglang"].elastic_pools == {"swa"}
    assert "swa" not in ENGINES["vllm"].elastic_pools  # vLLM's DeepSeek-V4 pools stay runtime-owned


def test_lint_accepts_an_elastic_swa_pool_with_its_budget() -> None:
    found = codes('model "dsv4" {\n engine sglang\n reserve 40 GiB\n min 2 GiB\n max 12 GiB\n weight 50\n'
                  ' pool swa { owner elastic }\n pool c4 { owner runtime }\n}\n')
    assert found == []


@pytest.mark.parametrize("pool", sorted((DEEPSEEK_V4_POOLS - {"swa"}) | {"req_to_token"}))
def test_lint_refuses_every_other_pool_elastic_with_the_reason(pool: str) -> None:
    found = codes(f'model "dsv4" {{\n engine sglang\n reserve 40 GiB\n pool {pool} {{ owner elastic }}\n}}\n')
    assert [(c, line) for c, line, _, _ in found] == [("KV013", 5)]
    _, _, message, hint = found[0]
    assert message == f"the sglang adapter cannot run pool '{pool}' elastically: {RUNTIME_OWNED_WHY[pool]}"
    assert "only `swa` can be elastic" in hint


def test_min_without_an_elastic_pool_still_warns_on_sglang() -> None:
    found = codes('model "dsv4" {\n engine sglang\n reserve 40 GiB\n min 2 GiB\n}\n')
    assert [(c, line) for c, line, _, _ in found] == [("KV022", 5)]
    assert "`pool swa { owner elastic }`" in found[0][3]
