"""allauth's passkey forms, with a passkey's answer that cannot be parsed refused as a wrong one.

The answer is the browser's JSON, and a client can post any. allauth parses it with fido2 and
catches some of fido2's errors (a TypeError, at sign-in and confirming a ValueError), not a missing
field (KeyError), nor, when a passkey is added, an id that is not its rawId or client data that is
not JSON (ValueError): each answered 500. Here the answer is parsed first, any of the three refused
with allauth's own error; allauth's checks then run as they did (settings.MFA_FORMS)."""

from allauth.mfa.adapter import get_adapter
from allauth.mfa.webauthn import forms
from fido2.webauthn import AuthenticationResponse, RegistrationResponse


def parsed(response_class, credential):
    try:
        response_class.from_dict(credential)
    except (KeyError, TypeError, ValueError) as error:
        raise get_adapter().validation_error("incorrect_code") from error
    return credential


class AuthenticateWebAuthnForm(forms.AuthenticateWebAuthnForm):
    def clean_credential(self):
        parsed(AuthenticationResponse, self.cleaned_data["credential"])
        return super().clean_credential()


class ReauthenticateWebAuthnForm(AuthenticateWebAuthnForm, forms.ReauthenticateWebAuthnForm):
    pass


class AddWebAuthnForm(forms.AddWebAuthnForm):
    def clean_credential(self):
        return parsed(RegistrationResponse, self.cleaned_data["credential"])
