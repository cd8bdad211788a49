"""Radix-tree reads: node walk, lock refs, hit counts (scheduler process).

Two layouts: the legacy ``RadixCache`` (``tree.root_node``, nodes with
``children`` and ``lock_ref``) and 0.5.2x's unified radix cache, whose nodes
live in a ``tree_core`` and carry per-component ``lock_ref``s; requests then
hold node ids. The Rust tree core (0.5.23's default) cannot be walked from
Python, so the harness selects the Python core (``sglang_compat.SERVER_ENV``).
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Optional


class TreeNotInspectable(RuntimeError):
    pass


def _root(tree: Any) -> Any:
    core = getattr(tree, "tree_core", None)
    if core is None:
        return tree.root_node
    try:
        return core.root_node
    except NotImplementedError as exc:
        raise TreeNotInspectable(
            f"{type(core).__name__} cannot be walked from Python; start the server with "
            "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python (the harness default)"
        ) from exc


def root_of(tree: Any) -> Any:
    """The tree's root node."""
    return _root(tree)


def resolve(tree: Any, handle: Any) -> Optional[Any]:
    """A node object for a node or node id; None if the id is gone (flushed)."""
    if handle is None or not isinstance(handle, int):
        return handle
    core = getattr(tree, "tree_core", None)
    if core is None:
        return None
    try:
        return core.node_by_id(handle)
    except (KeyError, IndexError, NotImplementedError):
        return None


def iter_nodes(tree: Any) -> Iterator[Any]:
    """Every node except the root."""
    stack = list(_root(tree).children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def node_lock_ref(tree: Any, handle: Any) -> int:
    node = resolve(tree, handle)
    if node is None:
        return 0
    component_data = getattr(node, "component_data", None)
    if component_data is not None:  # unified tree nodes
        return sum(cd.lock_ref for cd in component_data)
    return int(getattr(node, "lock_ref", 0))


def all_lock_refs(tree: Any) -> Dict[Any, int]:
    return {n.id: node_lock_ref(tree, n) for n in iter_nodes(tree)}


def all_hit_counts(tree: Any) -> Dict[Any, int]:
    return {n.id: int(getattr(n, "hit_count", 0)) for n in iter_nodes(tree)}


def node_count(tree: Any) -> int:
    return sum(1 for _ in iter_nodes(tree))


def in_current_tree(tree: Any, handle: Any) -> bool:
    """Whether a node a request holds (node or node id) is still part of the
    current tree; False once a reset replaced the tree under it."""
    if isinstance(handle, int):
        return resolve(tree, handle) is not None
    root = _root(tree)
    node = handle
    for _ in range(100_000):
        if node is root:
            return True
        parent = getattr(node, "parent", None)
        if parent is None:
            return False
        node = parent
    return False


def node_label(handle: Any) -> str:
    if isinstance(handle, int):
        return f"#{handle}"
    return f"#{getattr(handle, 'id', '?')}"
