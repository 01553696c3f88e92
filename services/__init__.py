"""splatq's services, one package each; every one runs alone (`python -m services.<name>`).

Services talk to each other only through Redis Streams; none imports another service.
"""
