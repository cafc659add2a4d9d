"""kopf handler registration: one index and one event handler per custom resource kind.

Handlers are registered on a fresh :class:`kopf.OperatorRegistry` per operator (never
kopf's global one), so tests can run several operators in one process.

Only ``@kopf.index`` and ``@kopf.on.event`` are used. Both are stateless on the
cluster side: kopf writes no annotations, progress or finalizers onto our objects, so
deleting a Model or a ModelProvider never waits for the operator. The probe timer is the
reconciler's own loop for the same reason (a kopf timer would add a finalizer to every
ModelProvider) and so one loop probes every provider at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf

from kubemoot.api import GROUP, RESOURCE_TYPES, VERSION, InputError, Resource, parse_manifest
from kubemoot.operator.reconciler import Reconciler
from kubemoot.operator.view import INDEX_IDS

__all__ = ["build_registry", "plain"]

Login = Callable[[], Awaitable[kopf.ConnectionInfo]]


def plain(value: Any) -> Any:
    """kopf's body views as plain dicts and lists, as the models and the diff expect."""
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


def _register(registry: kopf.OperatorRegistry, reconciler: Reconciler,
              cls: type[Resource]) -> None:
    kind = cls.KIND

    def index(body: Any, **_: Any) -> dict[str, Resource] | None:
        # A malformed object is left out of the view; its event handler reports it.
        try:
            resource = parse_manifest(plain(body))
        except InputError:
            return None
        return {resource.key: resource}

    async def on_event(body: Any, **kwargs: Any) -> None:
        reconciler.bind({name: kwargs[name] for name in INDEX_IDS.values() if name in kwargs})
        await reconciler.observe(kind, kwargs.get("type"), plain(body))

    kopf.index(GROUP, VERSION, cls.PLURAL, id=INDEX_IDS[kind], registry=registry)(index)
    kopf.on.event(GROUP, VERSION, cls.PLURAL, id=f"{cls.PLURAL}-event",
                  registry=registry)(on_event)


def build_registry(reconciler: Reconciler, *, login: Login) -> kopf.OperatorRegistry:
    """A registry with the login handler, indexes and event handlers of every kind."""
    registry = kopf.OperatorRegistry()

    async def on_login(**_: Any) -> kopf.ConnectionInfo:
        return await login()

    async def on_cleanup(**_: Any) -> None:
        reconciler.stop_probes()  # before kopf cancels what is left of its loop

    kopf.on.login(registry=registry)(on_login)
    kopf.on.cleanup(registry=registry)(on_cleanup)
    for cls in RESOURCE_TYPES.values():
        if cls.KIND in INDEX_IDS:  # ModelClass is the gateways' to read, not reconciled here
            _register(registry, reconciler, cls)
    return registry
