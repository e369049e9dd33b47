"""``custom_dataset`` loaders of the task YAMLs beside this file: the shipped items as a ``datasets`` split."""

from __future__ import annotations

from diffquant.tasks import load_task


def _split(task: str):
    import datasets

    docs = [{"id": item.id, "query": item.contexts[0], "choices": list(item.choices), "gold": item.gold}
            for item in load_task(task)]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def hellaswag(**_):
    return _split("hellaswag")


def arc_easy(**_):
    return _split("arc_easy")


def piqa(**_):
    return _split("piqa")


def boolq(**_):
    return _split("boolq")


def openbookqa(**_):
    return _split("openbookqa")


def copa(**_):
    return _split("copa")
