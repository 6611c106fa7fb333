"""Cordon and uncordon the node, remembering in an annotation which features cordoned it,
so that only a cordon of its own is ever lifted: a node an admin (or anyone else) cordoned
before stays cordoned, and one cordoned for two reasons (a MIG change, a driver upgrade) is
uncordoned when the last of them is done.

The annotation speaks only while the node is cordoned. Once someone else uncordons it
(``kubectl uncordon`` of a node whose upgrade failed), the cordon it recorded is gone, and
so is the annotation (``lifted_patch``, written as soon as the controller sees it):
otherwise a later cordon of theirs would be taken for the controller's and lifted.
"""

from __future__ import annotations

from .keys import CORDONED_BY
from .writer import merged

__all__ = ["Cordon", "cordon_patch", "uncordon_patch", "lifted_patch", "reasons"]


def _recorded(node: dict, annotation: str) -> list[str]:
    value = ((node.get("metadata") or {}).get("annotations") or {}).get(annotation) or ""
    return [r for r in value.split(",") if r]


def _unschedulable(node: dict) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def reasons(node: dict, annotation: str = CORDONED_BY) -> list[str]:
    """The features whose cordon holds the node (none when it is not cordoned)."""
    return _recorded(node, annotation) if _unschedulable(node) else []


def cordon_patch(node: dict, why: str, annotation: str = CORDONED_BY) -> dict | None:
    """The patch cordoning ``node`` for ``why``; None when it is cordoned already by someone
    else (then nothing of ours is recorded: their cordon is not ours to lift) or for ``why``."""
    ours = reasons(node, annotation)
    if why in ours or (_unschedulable(node) and not ours):
        return None
    return {"spec": {"unschedulable": True}, "metadata": {"annotations": {annotation: ",".join(ours + [why])}}}


def uncordon_patch(node: dict, why: str, annotation: str = CORDONED_BY) -> dict | None:
    """The patch lifting the cordon made for ``why``: the node is uncordoned when no other
    reason of ours holds it. None when ``why`` did not cordon it."""
    ours = reasons(node, annotation)
    if why not in ours:
        return lifted_patch(node, annotation)
    rest = [r for r in ours if r != why]
    if rest:
        return {"metadata": {"annotations": {annotation: ",".join(rest)}}}
    return {"spec": {"unschedulable": None}, "metadata": {"annotations": {annotation: None}}}


def lifted_patch(node: dict, annotation: str = CORDONED_BY) -> dict | None:
    """The patch forgetting cordons of ours that someone else lifted; None when there are none."""
    if _recorded(node, annotation) and not _unschedulable(node):
        return {"metadata": {"annotations": {annotation: None}}}
    return None


class Cordon:
    def __init__(self, writer, annotation: str = CORDONED_BY):
        self.writer = writer
        self.annotation = annotation

    def cordon(self, why: str, also=None) -> bool:
        """Cordon for ``why`` (and, in the same write, ``also(node)``'s patch); True when
        this call cordoned the node."""
        cordoned = [False]

        def change(node):
            patch = cordon_patch(node, why, self.annotation)
            cordoned[0] = patch is not None
            return merged(patch, also(node) if also else None)
        self.writer.update(change, f"cordoning for {why}")
        return cordoned[0]

    def uncordon(self, why: str, also=None) -> bool:
        """Lift the cordon made for ``why`` (and, in the same write, ``also(node)``'s patch);
        True when this call uncordoned the node."""
        lifted = [False]

        def change(node):
            patch = uncordon_patch(node, why, self.annotation)
            lifted[0] = "spec" in (patch or {})
            return merged(patch, also(node) if also else None)
        self.writer.update(change, f"uncordoning after {why}")
        return lifted[0]

    def holds(self, why: str) -> bool:
        node = self.writer.node
        return node is not None and why in reasons(node, self.annotation)

    def holders(self) -> list[str] | None:
        """The features of ours whose cordon holds the node ([]: someone else's); None when
        the node is not cordoned."""
        node = self.writer.node or {}
        return reasons(node, self.annotation) if _unschedulable(node) else None

    def lifted(self) -> bool:
        """Whether a cordon of ours was lifted by someone else (``forget_lifted`` is due)."""
        node = self.writer.node
        return node is not None and lifted_patch(node, self.annotation) is not None

    def forget_lifted(self) -> None:
        self.writer.update(lambda n: lifted_patch(n, self.annotation), "forgetting a cordon someone else lifted")
