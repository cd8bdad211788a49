"""Radix-tree reads: node walk, lock refs, hit counts (scheduler process).

Two tree layouts exist: the Python radix cache with ``root_node`` /
``children`` / ``lock_ref`` on node objects, and caches backed by a native
``tree_core`` addressed through node handles.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator


def _core(tree: Any) -> Any:
    return getattr(tree, "tree_core", None)


def iter_nodes(tree: Any) -> Iterator[Any]:
    """Every node except the root (node objects, or handles for a tree_core)."""
    core = _core(tree)
    if core is not None:
        stack = list(core.get_child_node_ids(core.root_node_handle()))
        children = core.get_child_node_ids
    else:
        root = getattr(tree, "root_node", None)
        if root is None:
            return
        stack = list(root.children.values())
        children = lambda node: node.children.values()  # noqa: E731
    while stack:
        node = stack.pop()
        yield node
        stack.extend(children(node))


def node_key(tree: Any, node: Any) -> Any:
    return node if _core(tree) is not None else getattr(node, "id", id(node))


def node_lock_ref(tree: Any, node: Any) -> int:
    if node is None:
        return 0
    core = _core(tree)
    if core is not None:
        if not core.contains_node(node):
            return 0
        return sum(
            core.get_component_device_lock_ref(node, component)
            for component in tree.tree_components
        )
    component_data = getattr(node, "component_data", None)
    if component_data is not None:  # unified tree nodes
        return sum(cd.lock_ref for cd in component_data)
    return int(getattr(node, "lock_ref", 0))


def node_hit_count(tree: Any, node: Any) -> int:
    core = _core(tree)
    if core is not None:
        return int(core.get_node_hit_count(node))
    return int(getattr(node, "hit_count", 0))


def all_lock_refs(tree: Any) -> Dict[Any, int]:
    return {node_key(tree, n): node_lock_ref(tree, n) for n in iter_nodes(tree)}


def all_hit_counts(tree: Any) -> Dict[Any, int]:
    return {node_key(tree, n): node_hit_count(tree, n) for n in iter_nodes(tree)}


def node_count(tree: Any) -> int:
    return sum(1 for _ in iter_nodes(tree))
