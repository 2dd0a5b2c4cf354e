"""``create_app``: the admission reviews answered ahead of Flask (``Reviews``), Flask's
routes for everything else; the admission paths are declared to Flask without a view,
so another method is answered there as before."""

from __future__ import annotations

from harness import REPO, admission_review, run_pod

from webhook.serving.app import create_app
from webhook.serving.reviews import PATHS


def test_the_admission_paths_have_no_flask_view_and_are_answered_ahead_of_it() -> None:
    app = create_app({"policy_dir": str(REPO / "policies")})
    declared = {rule.rule: rule.endpoint for rule in app.url_map.iter_rules()}
    assert set(PATHS) <= set(declared)
    assert not {declared[path] for path in PATHS} & set(app.view_functions)  # no dead body
    client = app.test_client()
    sent = admission_review(run_pod())
    for path in ("/mutate", "/validate"):
        answer = client.post(path, json=sent)
        assert answer.status_code == 200 and answer.mimetype == "application/json"
        review = answer.get_json()
        assert review["kind"] == "AdmissionReview"
        assert review["response"]["uid"] == sent["request"]["uid"]


def test_another_method_on_an_admission_path_is_flasks_405_and_options_answered() -> None:
    client = create_app({"policy_dir": str(REPO / "policies")}).test_client()
    for path in PATHS:
        refused = client.get(path)
        assert refused.status_code == 405
        assert refused.get_json() == {
            "error": "MethodNotAllowed",
            "code": 405,
            "message": "The method is not allowed for the requested URL.",
        }
        options = client.options(path)
        assert options.status_code == 200
        assert set(options.headers["Allow"].split(", ")) == {"OPTIONS", "POST"}
