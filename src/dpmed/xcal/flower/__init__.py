"""XCal-FL as a Flower app (flwr 1.23), run by Flower's deployment engine (a SuperLink, one
SuperNode per client site, `flwr run`) or its simulation engine (every client in one process).

`server_app` plays dpmed's xcal server (`dpmed.xcal.federation`) and checks every client's
report and update; `client_app` is dpmed's `Client` under its site's policy (`policy`); `wire`
is what they send each other; `runconfig` the job as the app's run config; `certs` a
federation's TLS certificates and SuperNode keys; `deploy` starts local federations (TLS,
SuperNode authentication) on 127.0.0.1 and runs one job on each.
"""

# The ServerApp's progress lines start "[flower <run>]"; the launcher relays them.
PROGRESS_LABEL = "flower"
