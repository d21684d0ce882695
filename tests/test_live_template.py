"""The live drill's rollback target, without a cluster: the current template with only the application container's
image reverted, and what the target revision differs in besides that image, container by container."""
from __future__ import annotations

import copy

import pytest

from drills.core.errors import Refused
from drills.run.live import check_other_differences, other_differences, rollback_template
from drills.core.podtemplate import container_images, template_differences


def _template(app: str, sidecar: str, init: str = "registry.local/init:1", **pod) -> dict:
    return {"metadata": {"labels": {"app": "svc"}},
            "spec": {"initContainers": [{"name": "setup", "image": init}],
                     "containers": [{"name": "app", "image": app, "ports": [{"containerPort": 8080}]},
                                    {"name": "sidecar", "image": sidecar, "env": [{"name": "A", "value": "1"}]}],
                     **pod}}


V1 = _template("registry.local/svc:v1", "registry.local/sidecar:1")
V2 = _template("registry.local/svc:v2", "registry.local/sidecar:2")


def test_the_rollback_target_is_the_current_template_with_only_the_app_image_reverted():
    ro = {"spec": {"template": copy.deepcopy(V2)}}
    sent = rollback_template(ro, V1, "app")
    assert container_images(sent) == {"setup": "registry.local/init:1", "app": "registry.local/svc:v1",
                                      "sidecar": "registry.local/sidecar:2"}
    # compared with the template before the drill, container by container: only the app's image differs
    assert template_differences(V2, sent, "app") == []
    assert sent["spec"]["containers"][1] == V2["spec"]["containers"][1]
    assert ro["spec"]["template"] == V2             # the current template itself is not changed


def test_differences_besides_the_app_image_are_named_container_by_container():
    assert other_differences({"stable_template": V2, "target_template": V1, "app": "app"}) == [
        "container sidecar: image registry.local/sidecar:2 -> registry.local/sidecar:1"]
    target = copy.deepcopy(V1)
    target["spec"]["initContainers"][0]["image"] = "registry.local/init:0"
    target["spec"]["containers"][1]["env"] = [{"name": "A", "value": "0"}]
    target["spec"]["containers"][0]["args"] = ["--old"]
    target["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    target["spec"]["containers"].append({"name": "agent", "image": "registry.local/agent:1"})
    assert template_differences(V2, target, "app") == [
        "init container setup: image registry.local/init:1 -> registry.local/init:0",
        "container app: args differ",
        "container sidecar: image registry.local/sidecar:2 -> registry.local/sidecar:1",
        "container sidecar: env differ",
        "container agent: added (image registry.local/agent:1)",
        "pod spec: volumes differ"]
    # the app's own image is the one change the drill makes: never a difference when named
    assert template_differences(V2, _template("registry.local/svc:v1", "registry.local/sidecar:2"), "app") == []
    assert template_differences(V2, _template("registry.local/svc:v1", "registry.local/sidecar:2")) == [
        "container app: image registry.local/svc:v2 -> registry.local/svc:v1"]


def test_a_target_that_differs_in_a_sidecar_is_refused_naming_it_and_both_images_unless_allowed():
    others = other_differences({"stable_template": V2, "target_template": V1, "app": "app"})
    with pytest.raises(Refused) as e:
        check_other_differences("ns/svc", "app", others, allow=False, via="gitops")
    assert "sidecar" in str(e.value) and "registry.local/sidecar:2" in str(e.value) \
        and "registry.local/sidecar:1" in str(e.value) and "--allow-other-changes" in str(e.value)
    check_other_differences("ns/svc", "app", others, allow=True, via="gitops")
    with pytest.raises(Refused, match="undo writes the target revision's whole template"):
        check_other_differences("ns/svc", "app", others, allow=True, via="undo")
    check_other_differences("ns/svc", "app", [], allow=False, via="undo")
