"""`python -m scheduler_svc` is `railover`."""

from scheduler_svc.cli import main

main()
