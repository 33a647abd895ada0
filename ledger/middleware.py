"""A request id for every request, carried into the audit events it writes, with the second
factor given for it (step-up)."""

import contextvars
import uuid

current_request_id = contextvars.ContextVar("current_request_id", default="")
# The second factor a person gave for the decision this request takes (console.stepup): its
# method and when, recorded in each audit event the decision writes.
current_step_up = contextvars.ContextVar("current_step_up", default=None)
# The decision link a decision is taken through (approvals.links): recorded the same way.
current_decision_link = contextvars.ContextVar("current_decision_link", default=None)


class RequestIdMiddleware:
    header = "HTTP_X_REQUEST_ID"

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        incoming = request.META.get(self.header, "")
        request_id = incoming if 0 < len(incoming) <= 64 and incoming.isprintable() else uuid.uuid4().hex
        token = current_request_id.set(request_id)
        try:
            response = self.get_response(request)
        finally:
            current_request_id.reset(token)
        response["X-Request-ID"] = request_id
        return response
