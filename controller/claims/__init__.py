"""Reading claims: device requests, DRA CEL selectors, quantities, a pod's claims, claim constraints."""
