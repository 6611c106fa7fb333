"""Cordon and uncordon the node, remembering in an annotation which features cordoned it,
so that only a cordon of its own is ever lifted: a node an admin (or anyone else) cordoned
before stays cordoned, and one cordoned for two reasons (a MIG change, a driver upgrade) is
uncordoned when the last of them is done."""

from __future__ import annotations

from .keys import CORDONED_BY

__all__ = ["Cordon", "cordon_patch", "uncordon_patch", "reasons"]


def reasons(node: dict, annotation: str = CORDONED_BY) -> list[str]:
    value = ((node.get("metadata") or {}).get("annotations") or {}).get(annotation) or ""
    return [r for r in value.split(",") if r]


def _unschedulable(node: dict) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def cordon_patch(node: dict, why: str, annotation: str = CORDONED_BY) -> dict | None:
    """The patch cordoning ``node`` for ``why``; None when it is cordoned already by someone
    else (then nothing of ours is recorded: their cordon is not ours to lift) or for ``why``."""
    ours = reasons(node, annotation)
    if why in ours:
        return None if _unschedulable(node) else {"spec": {"unschedulable": True}}
    if _unschedulable(node) and not ours:
        return None
    return {"spec": {"unschedulable": True}, "metadata": {"annotations": {annotation: ",".join(ours + [why])}}}


def uncordon_patch(node: dict, why: str, annotation: str = CORDONED_BY) -> dict | None:
    """The patch lifting the cordon made for ``why``: the node is uncordoned when no other
    reason of ours holds it. None when ``why`` did not cordon it."""
    ours = reasons(node, annotation)
    if why not in ours:
        return None
    rest = [r for r in ours if r != why]
    if rest:
        return {"metadata": {"annotations": {annotation: ",".join(rest)}}}
    return {"spec": {"unschedulable": None}, "metadata": {"annotations": {annotation: None}}}


class Cordon:
    def __init__(self, writer, annotation: str = CORDONED_BY):
        self.writer = writer
        self.annotation = annotation

    def cordon(self, why: str) -> bool:
        """Cordon for ``why``; True when this call cordoned the node."""
        return self.writer.update(lambda n: cordon_patch(n, why, self.annotation), f"cordoning for {why}") is not None

    def uncordon(self, why: str) -> bool:
        """Lift the cordon made for ``why``; True when this call changed the node."""
        return self.writer.update(lambda n: uncordon_patch(n, why, self.annotation),
                                  f"uncordoning after {why}") is not None

    def holds(self, why: str) -> bool:
        node = self.writer.node
        return node is not None and why in reasons(node, self.annotation)
