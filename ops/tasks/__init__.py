"""The operator's task collection. One module per area, each a sub-collection (`model.synth`, ...)."""

from __future__ import annotations

from invoke import Collection


def namespace() -> Collection:
    # Imported here so `vlfleet --help` does not pay for every area's imports up front.
    from ops.tasks import (
        bench,
        demo,
        fleet,
        llamacpp,
        model,
        monitoring,
        os_mirror,
        preflight,
        report,
        serve,
        site,
        staging,
        wheelhouse,
    )

    ns = Collection()
    ns.add_collection(Collection.from_module(model), name="model")
    ns.add_collection(Collection.from_module(llamacpp), name="llamacpp")
    ns.add_collection(Collection.from_module(wheelhouse), name="wheelhouse")
    ns.add_task(serve.serve)
    ns.add_collection(Collection.from_module(bench), name="bench")
    ns.add_collection(Collection.from_module(staging), name="staging")
    ns.add_collection(Collection.from_module(os_mirror), name="os-mirror")
    ns.add_task(site.site)
    for t in (fleet.rollout, fleet.rollback, fleet.restart, fleet.status_, fleet.logs, fleet.tune):
        ns.add_task(t)
    ns.add_task(preflight.preflight)
    ns.add_collection(Collection.from_module(monitoring), name="monitoring")
    ns.add_task(report.report)
    ns.add_task(demo.demo)
    return ns
