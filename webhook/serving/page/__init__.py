"""The topology page: what the cluster and our recent decisions look like (snapshot.py), drawn as
HTML or JSON (render.py)."""
