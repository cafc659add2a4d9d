"""A cheaper ``__init__`` for the frozen, slotted dataclasses made once per call or more.

A frozen dataclass sets each field in ``__init__`` through ``object.__setattr__``
(its own ``__setattr__`` refuses every assignment), which CPython 3.11 runs as a
wrapper call that packs and unpacks an argument tuple and checks the type hierarchy.
Under callgrind an eight-field frozen, slotted class took about 13,000 instructions to
make, a mutable one about 2,800. The simulator makes some 36,000 frozen objects a
fleet-16 run (store changes and entries, priced options, placements), most of them with
four to eleven fields. :func:`quick_init` gives such a class an ``__init__`` with the
same parameters and defaults that sets each slot through its member descriptor's
``__set__`` (the eight-field class: about 7,600), so the class stays frozen, equal,
hashable and printable as before.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import Any, TypeVar

__all__ = ["quick_init"]

T = TypeVar("T")


def quick_init(cls: type[T]) -> type[T]:
    """Replace the dataclass-made ``__init__`` of ``cls`` (frozen, with ``slots=True``)
    by one that sets the same slots to the same values in the same order, through the
    slots' descriptors. Apply it above ``@dataclass``. Refuses what it does not
    reproduce: a class that is not a frozen slotted dataclass, or one with ``InitVar``
    pseudo-fields."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in vars(cls):
        raise TypeError(f"{cls.__name__} is not a frozen dataclass with slots=True")
    declared = vars(cls).get("__dataclass_fields__", {})
    if any(f._field_type is dataclasses._FIELD_INITVAR  # type: ignore[attr-defined]
           for f in declared.values()):
        raise TypeError(f"{cls.__name__} has InitVar fields")
    original = cls.__init__  # type: ignore[misc]
    signature = inspect.signature(original)
    namespace: dict[str, Any] = {}
    header: list[str] = []
    star = False
    for name, param in signature.parameters.items():
        text = name
        if param.kind is param.KEYWORD_ONLY and not star:
            header.append("*")
            star = True
        if param.default is not param.empty:
            namespace[f"_default_{name}"] = param.default
            text += f"=_default_{name}"
        header.append(text)
    me = next(iter(signature.parameters))  # "self", unless a field has that name
    body: list[str] = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        descriptor = getattr(cls, f.name, None)
        if not isinstance(descriptor, types.MemberDescriptorType):
            raise TypeError(f"{cls.__name__}.{f.name} is not a slot")
        namespace[f"_set_{f.name}"] = descriptor.__set__
        factory = f.default_factory
        if factory is not dataclasses.MISSING:
            namespace[f"_factory_{f.name}"] = factory
        if f.init:
            value = f.name
            if factory is not dataclasses.MISSING:
                # the parameter's default is dataclasses' marker: call the factory then
                value = (f"_factory_{f.name}() if {f.name} is _default_{f.name} "
                         f"else {f.name}")
        elif factory is not dataclasses.MISSING:
            value = f"_factory_{f.name}()"
        elif f.default is not dataclasses.MISSING:
            namespace[f"_value_{f.name}"] = f.default
            value = f"_value_{f.name}"
        else:
            continue  # init=False without a default: left unset, as dataclasses do
        body.append(f"    _set_{f.name}({me}, {value})\n")
    if hasattr(cls, "__post_init__"):
        body.append(f"    {me}.__post_init__()\n")
    lines = "".join(body) or "    pass\n"
    source = f"def __init__({', '.join(header)}):\n{lines}"
    exec(source, namespace)
    init = namespace["__init__"]
    init.__qualname__ = original.__qualname__
    init.__module__ = original.__module__
    init.__doc__ = original.__doc__
    init.__annotations__ = dict(getattr(original, "__annotations__", {}))
    setattr(cls, "__init__", init)  # noqa: B010 - mypy refuses assigning a method
    return cls
