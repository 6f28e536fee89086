"""The provider's side as depositd sees it: models, signing, error codes and the client."""
