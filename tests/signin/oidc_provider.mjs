// A company's OpenID Connect provider for the sign-in tests: oidc-provider (npm) with one static
// client and the people given in OIDC_ACCOUNTS, held in memory. Its development login and consent
// pages take any login name: the name is the account's `sub`.
//
//   OIDC_PORT=9000 OIDC_CLIENT_ID=surety OIDC_CLIENT_SECRET=... OIDC_REDIRECT_URI=http://.../callback/ \
//   OIDC_ACCOUNTS='{"ada": {"email": "ada@company.example", "email_verified": true}}' node oidc_provider.mjs
import Provider from "oidc-provider";

const env = process.env;
const accounts = JSON.parse(env.OIDC_ACCOUNTS || "{}");
const issuer = `http://127.0.0.1:${env.OIDC_PORT}`;

const provider = new Provider(issuer, {
  clients: [{
    client_id: env.OIDC_CLIENT_ID,
    client_secret: env.OIDC_CLIENT_SECRET,
    redirect_uris: [env.OIDC_REDIRECT_URI],
    grant_types: ["authorization_code"],
    response_types: ["code"],
  }],
  async findAccount(ctx, sub) {
    if (!(sub in accounts)) return undefined;
    return { accountId: sub, async claims() { return { sub, ...accounts[sub] }; } };
  },
  claims: { openid: ["sub"], email: ["email", "email_verified"], profile: ["name", "preferred_username"] },
  cookies: { keys: ["tests-only-cookie-key"] },
  features: { devInteractions: { enabled: true } },
});
provider.listen(Number(env.OIDC_PORT), "127.0.0.1", () => console.log(`oidc-provider at ${issuer}`));
