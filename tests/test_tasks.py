"""Task readers: the shipped files parse to the published item counts, subsets are fixed, bad input is one line."""
import json
import re

import pytest

from diffquant.data import calib_dir
from diffquant.tasks import (
    TASKS,
    Item,
    canonical_task,
    hellaswag_preprocess,
    limit_ids,
    load_task,
    read_items,
    subset_ids,
)

COUNTS = {"hellaswag": 10042, "arc_easy": 2376, "piqa": 1838, "winogrande": 1267, "boolq": 3270,
          "lambada": 5153, "openbookqa": 500, "copa": 100}
FIXTURES = calib_dir() / "eval" / "fixtures"


@pytest.fixture(scope="module")
def all_items():
    return {name: load_task(name) for name in TASKS}


def test_counts_match_the_published_sizes(all_items):
    assert {name: len(items) for name, items in all_items.items()} == COUNTS


def test_items_are_well_formed(all_items):
    for name, items in all_items.items():
        assert [it.id for it in items] == list(range(len(items)))
        for it in items:
            assert it.task == name and 0 <= it.gold < len(it.choices)
            assert len(it.contexts) in (1, len(it.choices))
            for ctx, cont in it.requests():
                assert ctx and ctx == ctx.rstrip() and cont.startswith(" ") and cont.strip()


def test_prompt_formats(all_items):
    arc = all_items["arc_easy"][0]
    assert arc.contexts[0].startswith("Question: ") and arc.contexts[0].endswith("\nAnswer:")
    assert arc.requests()[0][1] == " " + arc.choices[0]
    piqa = all_items["piqa"][0]  # the shipped query ends with "\n": stripped as llm-foundry does
    assert piqa.contexts[0].endswith("?\nAnswer:") and "\n\n" not in piqa.contexts[0]
    assert all_items["boolq"][0].choices == ("no", "yes")
    copa = all_items["copa"][0]
    assert copa.requests()[1] == ("The man turned on the faucet, therefore", " water flowed from the spout.")
    wino = all_items["winogrande"][0]
    assert wino.requests() == [("Sarah was a much better surgeon than Maria so Sarah", " always got the easier cases."),
                               ("Sarah was a much better surgeon than Maria so Maria", " always got the easier cases.")]
    lam = all_items["lambada"][0]
    assert len(lam.requests()) == 1 and lam.requests()[0][1] == " signs" and lam.gold == 0


def test_hellaswag_gets_lm_eval_preprocessing(all_items):
    hs = all_items["hellaswag"]
    first = hs[0]
    assert first.gold == 3 and len(first.choices) == 4
    assert first.contexts[0] == "Roof shingle removal: A man is sitting on a roof. He"  # ctx_b capitalised
    assert first.choices[3] == "starts pulling up roofing on a roof."
    bracketed = re.compile(r"\[.*?\]")  # lm-eval drops every bracketed bit (WikiHow artefacts)
    assert not any(bracketed.search(text) for it in hs for text in (*it.contexts, *it.choices))


def test_hellaswag_preprocess_is_lm_evals():
    assert hellaswag_preprocess(" How to cook [title] Boil water. [step] Add  salt [www.x.org]. ") == \
        "How to cook. Boil water. Add salt ."


def test_hellaswag_text_format(tmp_path):
    path = tmp_path / "hs.txt"
    lines = ["Cooking: Put it in a pot [header] first. the man", "1",
             "sits.", "stands  up.", "runs.", "eats [title] now."]
    path.write_text("\n".join(lines) + "\n")
    (item,) = read_items(path, "hellaswag", "hellaswag")
    assert item.contexts == ("Cooking: Put it in a pot first. The man",)
    assert item.choices == ("sits.", "stands up.", "runs.", "eats. now.") and item.gold == 1
    path.write_text("Cooking: x\n1\na\nb\nc\n")
    with pytest.raises(ValueError, match="not a multiple of 6"):
        read_items(path, "hellaswag", "hellaswag")


def test_fixtures_read_in_their_tasks_formats():
    hs = load_task("hellaswag", path=FIXTURES / "hellaswag_small.jsonl")
    assert len(hs) == 4 and hs[0].gold == 3 and hs[0].choices[0].startswith(", the man")
    piqa = load_task("piqa", path=FIXTURES / "piqa_small.jsonl")
    assert piqa[0].contexts == ("When boiling butter, when it's ready, you can\nAnswer:",)
    wino = load_task("winogrande", path=FIXTURES / "winograd_small.jsonl")
    assert len(wino) == 4 and len(wino[0].contexts) == 2
    lam = load_task("lambada", path=FIXTURES / "lambada_small.jsonl")
    assert len(lam) == 4 and all(len(it.choices) == 1 for it in lam)


def test_limit_takes_the_first_items_as_lm_eval_does(all_items):
    assert load_task("copa", limit=7) == all_items["copa"][:7]
    assert load_task("copa", limit=7, seed=5) == all_items["copa"][:7]  # the seed plays no part
    assert limit_ids(5, 9) == list(range(5))
    with pytest.raises(ValueError, match="unknown subset 'all'"):
        load_task("copa", limit=3, subset="all")


def test_limit_with_subset_random_is_a_fixed_seeded_subset(all_items):
    a = load_task("copa", limit=10, seed=3, subset="random")
    assert [it.id for it in a] == [it.id for it in load_task("copa", limit=10, seed=3, subset="random")]
    assert [it.id for it in a] != [it.id for it in load_task("copa", limit=10, seed=4, subset="random")]
    assert [it.id for it in a] != list(range(10))
    assert a == [all_items["copa"][it.id] for it in a]  # ids index the whole file
    assert [it.id for it in a] == sorted(it.id for it in a)
    small = {it.id for it in load_task("copa", limit=5, seed=3, subset="random")}
    assert small <= {it.id for it in a}  # nested: a smaller limit is a subset of a larger one
    assert len(load_task("copa", limit=1000)) == 100
    assert subset_ids(10, 3, seed=0) == subset_ids(10, 3, seed=0) and len(set(subset_ids(10, 3))) == 3


@pytest.mark.parametrize("limit", [0, -1, 2.5, True])
def test_bad_limit(limit):
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        load_task("copa", limit=limit)
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        load_task("copa", limit=limit, subset="random")


def test_unknown_task_is_a_one_line_error():
    with pytest.raises(ValueError) as err:
        load_task("helaswag")
    assert "unknown task 'helaswag'" in str(err.value) and "\n" not in str(err.value)
    assert "hellaswag" in str(err.value)


def test_aliases():
    assert canonical_task("ARC-Easy") == "arc_easy"
    assert canonical_task("openbook_qa") == "openbookqa" and canonical_task("lambada_openai") == "lambada"


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="holds no items"):
        load_task("copa", path=empty)
    with pytest.raises(FileNotFoundError):
        load_task("copa", path=tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match="task data not found"):
        load_task("copa", calib=tmp_path)


@pytest.mark.parametrize("row, why", [
    ({"query": "q", "choices": ["a", "b"]}, "missing field 'gold'"),
    ({"query": "q", "choices": ["a", "b"], "gold": 2}, "gold 2 is not an index"),
    ({"query": "q", "choices": ["a", "b"], "gold": True}, "gold True"),
    ([1, 2], "not a JSON object"),
])
def test_malformed_lines_name_file_and_line(tmp_path, row, why):
    path = tmp_path / "bad.jsonl"
    good = {"query": "q", "choices": ["a", "b"], "gold": 0}
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError) as err:
        load_task("copa", path=path)
    msg = str(err.value)
    assert f"{path}:2:" in msg and why in msg and "\n" not in msg


def test_requests_pair_contexts_and_choices():
    item = Item("t", 0, ("c1", "c2"), ("x", "y"), 1, " ")
    assert item.requests() == [("c1", " x"), ("c2", " y")]
    assert Item("t", 0, ("c",), ("x", "y"), 0, " ").requests() == [("c", " x"), ("c", " y")]
