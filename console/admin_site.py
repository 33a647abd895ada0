"""The admin site, where people, their roles and their second factors are kept: every page of it
asks for a fresh second factor, as a money decision does (console.stepup). Without it, a session
taken without its person's factor could remove that factor there, enrol one of its own, step up
with it and decide; or make itself a superuser, while naming a delegate asks for a factor. Its
pages too, not only its changes: a change asked without a fresh factor is not replayed from the
factor page (the admin answers many with a page, a confirmation or a form with errors, whose form
would then post to the factor page), the person is sent back to its page instead."""

from allauth.account.decorators import secure_admin_login
from django.contrib import admin
from django.http import HttpResponseRedirect
from django.urls import reverse

from .stepup import step_up_required


class AdminSite(admin.AdminSite):
    def admin_view(self, view, cacheable=False):
        if view != self.logout:  # signing out asks for nothing
            view = step_up_required(view, every_request=True)
        return super().admin_view(view, cacheable)

    def login(self, request, extra_context=None):
        """The admin signs in through the product's sign-in pages, second factor, failed-attempt
        limit and PASSWORD_SIGN_IN included: Django's own form signed a staff person in with a
        password alone. allauth's `secure_admin_login` sends the signed out there and refuses the
        signed-in who are not staff (403); the staff it lets through go to the admin's index, never
        to Django's form, which took another person's password from a session already signed in
        and made it theirs. Here, not by wrapping `admin.site.login` in the URLconf: the admin's
        URLs hold the view they were built with, before such a line ran."""
        index = reverse("admin:index", current_app=self.name)
        return secure_admin_login(lambda request: HttpResponseRedirect(index))(request)
