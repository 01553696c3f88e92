"""Remote model backends (`SPLATQ_MODEL=remote`): the reconstruction runs at a vendor's hosted
model, under the fleet-wide limits of shared/vendor/ (docs/hosted-model.md)."""
