"""`drills alerts`: Prometheus alerting rules for the Rollouts `drills scan` reads, and the drill that proves them.

Modules: ramp (the expected ramp of a rollback: the formula, its parameters), metrics (the metrics the rules read,
from the controller's /metrics and kube-state-metrics' custom-resource-state metrics, and that config), rules (the
rules per Rollout, the PrometheusRule manifest), promtool (promtool check / test rules, and the unit tests it
runs), command (what `drills alerts` does; drills.cli owns its arguments), ksm (the real kube-state-metrics the
drill runs with that config), evidence and drill (the alert drill on the embedded cluster; lane ``alert`` records it).
"""
