"""What the two federated studies (fets, xcal) share: weighted averaging of model tensors."""
