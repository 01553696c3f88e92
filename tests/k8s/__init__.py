"""Tests of the Kubernetes, Prometheus and Grafana material under k8s/."""
