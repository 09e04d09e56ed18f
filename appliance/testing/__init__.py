"""Stand-ins for Apple's services, for tests and benchmarks: nothing here runs in `appliance serve`."""
