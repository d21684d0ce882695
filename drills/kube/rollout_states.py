"""What a Rollout is in, as named predicates the waits of drills.kube.rollout hold (each needs the controller to
have observed the latest spec), and one line that says what it was last seen in."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Predicate:
    name: str
    fn: Callable[[Any], bool]

    def __call__(self, obj) -> bool:
        return bool(obj) and bool(self.fn(obj))


def summarize_rollout(ro: dict | None) -> str:
    if not ro:
        return "no Rollout"
    st = ro.get("status") or {}
    w = ((st.get("canary") or {}).get("weights") or {}).get("canary", {}).get("weight")
    return (f"phase={st.get('phase')} step={st.get('currentStepIndex')} abort={st.get('abort', False)} "
            f"promoteFull={st.get('promoteFull', False)} stableRS={st.get('stableRS')} "
            f"currentPodHash={st.get('currentPodHash')} canaryWeight={w} "
            f"observedGeneration={st.get('observedGeneration')}/{ro['metadata'].get('generation')} "
            f"message={st.get('message')!r}")


# --- predicates --------------------------------------------------------------------------------
def _observed(ro) -> bool:
    st = ro.get("status") or {}
    return str(st.get("observedGeneration")) == str(ro["metadata"].get("generation"))


def healthy() -> Predicate:
    return Predicate("Rollout Healthy (controller observed the latest spec)",
                     lambda ro: _observed(ro) and (ro.get("status") or {}).get("phase") == "Healthy")


def healthy_at(pod_hash: str) -> Predicate:
    return Predicate(f"Rollout Healthy with stableRS {pod_hash}",
                     lambda ro: healthy()(ro) and ro["status"].get("stableRS") == pod_hash
                     and ro["status"].get("currentPodHash") == pod_hash)


def paused() -> Predicate:
    return Predicate("Rollout Paused", lambda ro: _observed(ro) and (ro.get("status") or {}).get("phase") == "Paused")


def at_step(index: int) -> Predicate:
    return Predicate(f"currentStepIndex == {index}",
                     lambda ro: _observed(ro) and (ro.get("status") or {}).get("currentStepIndex") == index)




def promote_taken(index: int | None) -> Predicate:
    """The controller took a plain promote of the pause at ``index``: it wrote a status without its own
    pause flag (``controllerPause``, set with every pause condition it adds, cleared once it completes the
    pause), or it paused again at a later step.  While that flag is set, no status the promote writes
    itself satisfies this."""
    def fn(ro):
        st = ro.get("status") or {}
        if not _observed(ro):
            return False
        if not st.get("controllerPause") and not st.get("pauseConditions"):
            return True
        return st.get("currentStepIndex") != index and bool(st.get("pauseConditions"))
    return Predicate(f"the controller took the promote of the pause at step {index}", fn)


def aborted() -> Predicate:
    return Predicate("Rollout aborted", lambda ro: bool((ro.get("status") or {}).get("abort")))


def degraded() -> Predicate:
    return Predicate("Rollout Degraded", lambda ro: (ro.get("status") or {}).get("phase") == "Degraded")
