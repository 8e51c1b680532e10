"""The pod admission webhook served by `flexmig controller`: HTTPS AdmissionReview v1 around the pure
shim rewrite (`controller/shim`), its TLS certificate, the caBundle, and the shim's templates.

| module | job |
|---|---|
| `certs` | self-signed CA + serving certificate, when and how to rotate (pure) |
| `certstore` | the certificate's home: a Secret shared by replicas, or a provided directory |
| `server` | the HTTPS listener; swaps its TLS context when the certificate changes |
| `review` | AdmissionReview request -> response (patch, denial, or a clear error) |
| `cabundle` | the CA bundle in the MutatingWebhookConfiguration |
| `templates` | templates exist before admission; unused ones are garbage-collected |
| `flexmigclaims` | whether a pod's own claim uses a flexmig DeviceClass |
| `service` | all of the above in one service; leader-only writes |
"""

from controller.webhook.service import WebhookService, WebhookSettings

__all__ = ["WebhookService", "WebhookSettings"]
