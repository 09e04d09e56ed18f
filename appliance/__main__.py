"""`python -m appliance` is the same program as the `appliance` binary."""

from appliance.cli import main

raise SystemExit(main())
