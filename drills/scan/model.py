"""What the scan knows about one Rollout, read from a Kubernetes object (a manifest, a render or a cluster).

Only the fields the rollback-exposure rules read are kept: replicas, the canary steps (with the line of each
step where the object came from a file), minPodsPerReplicaSet, rollbackWindow, replicaProgressThreshold,
dynamicStableScale, maxTrafficWeight and the routing kind:

- ``subset``: Istio with a DestinationRule and neither canaryService nor stableService (the seed's chart);
  the Istio UpdateHash guard of v1.8+ applies to it.
- ``host``: Istio routed by canaryService/stableService hosts; the guard does not apply.
- ``other``: any other traffic router (nginx, ALB, SMI, plugins, ...), or Istio without either form.
- ``none``: no trafficRouting (a basic canary: traffic follows pod counts, there is no weight to write).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..core.errors import BadInput
from ..core.steps import steps_text as _steps_text

ROLLOUT_KINDS = ("Rollout",)
# the fields of a canary step (CanaryStep, pkg/apis/rollouts/v1alpha1/types.go) and the four the controller's
# validation (hasMultipleStepsType) allows only one of per step; the others combine freely with them
STEP_FIELDS = ("setWeight", "pause", "experiment", "analysis", "setCanaryScale", "setHeaderRoute", "setMirrorRoute",
               "plugin")
ONE_OF = ("setWeight", "pause", "experiment", "analysis")
ROUTINGS = ("subset", "host", "other", "none")
_OTHER_ROUTERS = ("nginx", "alb", "smi", "ambassador", "appMesh", "traefik", "apisix", "plugins", "managedRoutes")


class ScanInputError(BadInput):
    """Input the scan cannot read (exit 2): the message starts with ``file:line:`` where there is one."""

    MAX_MESSAGE = 400           # a value echoed in the message is cut: one line, never the input's whole text

    def __init__(self, message: str, file: str | None = None, line: int | None = None):
        if len(message) > self.MAX_MESSAGE:            # the start names the object, the end says what is wrong
            cut = len(message) - self.MAX_MESSAGE
            half = self.MAX_MESSAGE // 2
            message = f"{message[:half]} ...({cut} characters cut)... {message[-half:]}"
        self.file, self.line, self.problem = file, line, message
        where = f"{file}:{line}: " if file and line else (f"{file}: " if file else "")
        super().__init__(where + message)

    def __reduce__(self):                 # raised in a worker process: keep file and line across the pickle
        return (type(self), (self.problem, self.file, self.line))


@dataclass
class ScannedRollout:
    namespace: str
    name: str
    source: str                          # "path:line", "fleet:<env>/<app>", "cluster:<context>"
    steps: list
    replicas: int
    routing: str
    router: str                          # istio, nginx, ..., or "" for none
    min_pods: int | None = None
    rollback_window: int | None = None   # rollbackWindow.revisions; None: no rollbackWindow
    rpt: dict | None = None              # replicaProgressThreshold {type, value}
    dss: bool = False                    # dynamicStableScale
    scale_down_delay: int | None = None  # scaleDownDelaySeconds
    max_weight: int = 100
    strategy: str = "canary"             # canary | blueGreen | none
    file: str | None = None              # where the object is (a manifest file), for messages
    line: int | None = None
    steps_file: str | None = None        # where the steps are declared (the manifest, or a values layer)
    step_lines: list = field(default_factory=list)   # line of each step in steps_file (None when unknown)
    steps_line: int | None = None        # line of the `steps:` key itself
    controller_version: str = ""
    origin: dict = field(default_factory=dict)       # env, app, component, cluster, ...
    invalid: list = field(default_factory=list)      # what the controller's validation refuses (InvalidSpec)
    spec_invalid: list = field(default_factory=list)  # the same for the routing (a step-less problem)
    background_analysis: bool = False                # spec.strategy.canary.analysis with templates
    schema_findings: list = field(default_factory=list)   # drills.scan.schema: fields the CRD prunes or rejects
    schema_unavailable: str | None = None            # why the version's CRD schema could not be had (not checked)
    raw: dict | None = field(default=None, repr=False, compare=False)   # the object as read (for the CRD check)
    lines: dict = field(default_factory=dict, repr=False, compare=False)  # its path -> line map
    replicas_given: bool = True          # spec.replicas set (absent: 1, or an autoscaler's to set)
    autoscalers: list = field(default_factory=list)  # drills.scan.autoscalers.Autoscaler that target it

    @property
    def size_range(self) -> tuple[int, int] | None:
        """(lowest minimum, highest maximum) of the autoscalers that target it; None: not autoscaled."""
        if not self.autoscalers:
            return None
        return min(a.min_replicas for a in self.autoscalers), max(a.max_replicas for a in self.autoscalers)

    @property
    def rejected(self) -> bool:
        """The apiserver refuses the object (its CRD schema rejects a field): the controller never sees it."""
        return any(f.kind == "rejected" for f in self.schema_findings)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def shape(self) -> tuple:
        """Everything a prediction reads (Rollouts with the same shape get the same prediction)."""
        return (self.strategy, self.routing, self.router, repr(self.steps), self.replicas, self.min_pods,
                self.rollback_window, repr(self.rpt), self.dss, self.scale_down_delay is None, self.max_weight,
                tuple(self.invalid), self.background_analysis, self.rejected)


# --- reading a Kubernetes object --------------------------------------------------------------------------
INT32_MAX = 2**31 - 1          # Kubernetes' integer fields are int32: anything larger is no Rollout the API accepts


def _int(value, what: str, file, line, minimum: int = 0, maximum: int | None = INT32_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or \
            (maximum is not None and value > maximum):
        bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise ScanInputError(f"{what} must be an integer {bound}, found {_brief(value)}", file, line)
    return value


def _brief(value, limit: int = 80) -> str:
    """A value as the error line shows it: its repr, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({type(value).__name__} of {len(text)} characters)"


def _mapping(value, what: str, file, line) -> dict:
    """A mapping field (absent or null: empty); anything else is refused naming the field."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ScanInputError(f"{what} must be a mapping, found {type(value).__name__} {value!r}"[:300], file, line)
    return value


def routing_of(canary: dict) -> tuple[str, str]:
    """(routing kind, router name) of a canary strategy (its trafficRouting already checked to be a mapping)."""
    tr = canary.get("trafficRouting")
    if not tr:
        return "none", ""
    istio = tr.get("istio")
    if isinstance(istio, dict):          # `istio: {}` is Istio (the controller checks the field is set)
        if canary.get("canaryService") or canary.get("stableService"):
            return "host", "istio"
        if istio.get("destinationRule"):
            return "subset", "istio"
        return "other", "istio"
    names = [k for k in tr if k in _OTHER_ROUTERS]
    return "other", (names[0] if names else "unknown")


def routing_invalid(canary: dict) -> list[str]:
    """What the controller's validation refuses in an nginx routing (pkg/apis/rollouts/validation, the same at
    v1.8.2 and v1.10.2): both canaryService and stableService, and exactly one of stableIngress and
    stableIngresses."""
    tr = canary.get("trafficRouting")
    nginx = tr.get("nginx") if isinstance(tr, dict) else None
    if not isinstance(nginx, dict):
        return []
    out = []
    if not canary.get("canaryService") or not canary.get("stableService"):
        out.append("trafficRouting.nginx without both canaryService and stableService")
    if bool(nginx.get("stableIngress")) == bool(nginx.get("stableIngresses")):
        out.append("trafficRouting.nginx with " + ("both" if nginx.get("stableIngress") else "neither") +
                   " of stableIngress and stableIngresses")
    return out


def check_steps(steps, file, line, step_lines=(), max_weight: int = 100) -> list:
    """The steps with the types the rules read checked (a wrong type raises ScanInputError naming the step's line:
    the CRD rejects it) and null fields dropped (the apiserver prunes them).  A step may set several fields: which
    combinations the controller refuses is ``invalid_steps``'s answer, not a reading error."""
    if steps is None:
        return []
    if not isinstance(steps, list):
        raise ScanInputError(f"spec.strategy.canary.steps must be a list, found {type(steps).__name__}", file, line)
    out = []
    for i, s in enumerate(steps):
        sl = step_lines[i] if i < len(step_lines) and step_lines[i] else line
        if not isinstance(s, dict):
            raise ScanInputError(f"canary step {i} must be a mapping (setWeight, pause, ...), found {s!r}"[:300],
                                 file, sl)
        s = {k: v for k, v in s.items() if v is not None}
        if "setWeight" in s:
            _int(s["setWeight"], f"canary step {i}: setWeight", file,
                 sl, maximum=max_weight)
        if "pause" in s:
            _mapping(s["pause"], f"canary step {i}: pause", file, sl)
        if "setCanaryScale" in s:
            scs = _mapping(s["setCanaryScale"], f"canary step {i}: setCanaryScale", file, sl)
            if scs.get("replicas") is not None:
                _int(scs["replicas"], f"canary step {i}: setCanaryScale.replicas", file, sl)
            if scs.get("weight") is not None:
                _int(scs["weight"], f"canary step {i}: setCanaryScale.weight", file, sl, maximum=max_weight)
        out.append(s)
    return out


def invalid_steps(steps: list) -> list[str]:
    """What the controller's validation (ValidateRolloutStrategyCanary) refuses in the steps: two of setWeight,
    pause, experiment and analysis in one step (hasMultipleStepsType), or a step that sets none of the step fields."""
    out = []
    for i, s in enumerate(steps):
        ones = [k for k in ONE_OF if k in s]
        if len(ones) > 1:
            out.append(f"step {i} sets {' and '.join(ones)}: one step may set only one of {', '.join(ONE_OF)}")
        elif not any(k in s for k in STEP_FIELDS):
            out.append(f"step {i} sets none of {', '.join(STEP_FIELDS)}")
    return out


def from_object(obj: dict, source: str, file: str | None = None, line: int | None = None,
                lines: dict | None = None, default_namespace: str = "default") -> ScannedRollout:
    """A Rollout object (as read by yamlstream or the API) -> ScannedRollout.  ``lines`` maps paths such as
    ("spec", "strategy", "canary", "steps", 0) to 1-based lines of ``file``.  A field the rules read that has
    the wrong type raises ScanInputError naming the field, the file and the line."""
    lines = lines or {}

    def at(*path):
        return lines.get(path, line)
    md = _mapping(obj.get("metadata"), "Rollout metadata", file, at("metadata"))
    name = md.get("name")
    if not isinstance(name, str) or not name:
        raise ScanInputError(f"Rollout without metadata.name (found {name!r})"[:300], file, line)
    namespace = md.get("namespace") or default_namespace
    if not isinstance(namespace, str):
        raise ScanInputError(f"Rollout {name}: metadata.namespace must be a string, found {namespace!r}"[:300],
                             file, at("metadata", "namespace"))
    spec = _mapping(obj.get("spec"), f"Rollout {name}: spec", file, at("spec"))
    strategy = _mapping(spec.get("strategy"), f"Rollout {name}: spec.strategy", file, at("spec", "strategy"))
    c_path = ("spec", "strategy", "canary")
    kind = "canary" if strategy.get("canary") is not None else ("blueGreen" if strategy.get("blueGreen") else "none")
    canary = _mapping(strategy.get("canary"), f"Rollout {name}: spec.strategy.canary", file, at(*c_path))
    replicas = _int(spec.get("replicas", 1), f"Rollout {name}: spec.replicas", file, at("spec", "replicas"))
    tr = _mapping(canary.get("trafficRouting"), f"Rollout {name}: trafficRouting", file,
                  at(*c_path, "trafficRouting"))
    _mapping(tr.get("istio"), f"Rollout {name}: trafficRouting.istio", file, at(*c_path, "trafficRouting", "istio"))
    max_weight = _int(tr.get("maxTrafficWeight", 100), f"Rollout {name}: trafficRouting.maxTrafficWeight", file,
                      at(*c_path, "trafficRouting", "maxTrafficWeight"), minimum=1)
    steps_path = c_path + ("steps",)
    raw_steps = canary.get("steps")
    step_lines = [lines.get(steps_path + (i,)) for i in range(len(raw_steps) if isinstance(raw_steps, list) else 0)]
    steps = check_steps(raw_steps, file, at(*steps_path), step_lines, max_weight)
    min_pods = canary.get("minPodsPerReplicaSet")
    if min_pods is not None:
        min_pods = _int(min_pods, f"Rollout {name}: minPodsPerReplicaSet", file, at(*c_path, "minPodsPerReplicaSet"))
    rw = _mapping(spec.get("rollbackWindow"), f"Rollout {name}: rollbackWindow", file, at("spec", "rollbackWindow"))
    window = None
    if rw.get("revisions") is not None:
        window = _int(rw["revisions"], f"Rollout {name}: rollbackWindow.revisions", file,
                      at("spec", "rollbackWindow", "revisions"))
    rpt = canary.get("replicaProgressThreshold")
    if rpt is not None:
        if not isinstance(rpt, dict) or rpt.get("type") not in ("Pods", "Percent") or \
                isinstance(rpt.get("value"), bool) or not isinstance(rpt.get("value"), int) or rpt["value"] < 0:
            raise ScanInputError(f"Rollout {name}: replicaProgressThreshold needs type Pods|Percent and an "
                                 f"integer value >= 0, found {rpt!r}"[:300], file,
                                 at(*c_path, "replicaProgressThreshold"))
    delay = canary.get("scaleDownDelaySeconds")
    if delay is not None:
        delay = _int(delay, f"Rollout {name}: scaleDownDelaySeconds", file, at(*c_path, "scaleDownDelaySeconds"))
    routing, router = routing_of(canary) if kind == "canary" else ("none", "")
    analysis = canary.get("analysis")
    return ScannedRollout(
        namespace=namespace, name=name, source=source, steps=steps, replicas=replicas, routing=routing, router=router,
        min_pods=min_pods, rollback_window=window, rpt=rpt, dss=canary.get("dynamicStableScale") is True,
        max_weight=max_weight, scale_down_delay=delay, strategy=kind, file=file, line=line, steps_file=file,
        step_lines=step_lines, steps_line=lines.get(steps_path), origin={}, invalid=invalid_steps(steps),
        spec_invalid=routing_invalid(canary) if kind == "canary" else [],
        background_analysis=isinstance(analysis, dict) and bool(analysis.get("templates")), raw=obj, lines=lines,
        replicas_given="replicas" in spec)


# --- steps ----------------------------------------------------------------------------------------------
def set_weights(steps: list) -> list[tuple[int, int]]:
    """[(step index, weight)] of every setWeight step."""
    return [(i, int(s["setWeight"])) for i, s in enumerate(steps) if isinstance(s, dict) and "setWeight" in s]


def last_set_weight_step(steps: list) -> tuple[int | None, int | None]:
    """(index, value) of the last setWeight: what the backward search finds from len(steps)-1 (the index is
    where a lint finding points)."""
    sw = set_weights(steps)
    return sw[-1] if sw else (None, None)


def prescribed(steps: list) -> list:
    """The prescription (brief §9.1): delete the last setWeight step when its value is 100, also when steps
    follow it (``[100, pause]`` -> ``[pause]``; drills.core.steps.cut_final_full_weight cuts only a trailing 100)."""
    i, w = last_set_weight_step(steps)
    if w is not None and i is not None and w >= 100:
        return steps[:i] + steps[i + 1:]
    return list(steps)


def steps_text(steps: list) -> str:
    """`[5, pause:10m, 100]` (`[]` for no steps); a step that sets several fields joins them with `+`
    (`setCanaryScale+setHeaderRoute`)."""
    if not steps:
        return "[]"

    def one(s: dict) -> str:
        if not s:
            return "{}"
        return "+".join(_steps_text([{k: v}]) if k in ("setWeight", "pause") else k for k, v in s.items())
    return f"[{', '.join(one(s) for s in steps)}]"
