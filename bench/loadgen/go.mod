module fleetmq/bench/loadgen

go 1.22
