"""`python -m webhook` runs the topology-webhook command."""
from .cli import main

raise SystemExit(main())
