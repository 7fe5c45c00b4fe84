"""XCal-FL as a Flower app (flwr 1.23), run by Flower's deployment engine (a SuperLink, one
SuperNode per client site, `flwr run`) or its simulation engine (every client in one process).

The ServerApp (`server_app`) plays dpmed's xcal server with what the in-process run uses
(`dpmed.xcal.federation`): the m-of-K schedule, sample-weighted FedAvg, the test evaluation
and rounds.csv, road.json, model.pt and privacy.json as the in-process run writes them. The
ClientApp (`client_app`) is dpmed's `Client` (`dpmed.xcal.client`) under the job's method
under its site's policy (`policy`), its state (generators, ledgers, Rényi filter) kept
between rounds and Flower runs in a ledger file on the SuperNode, which never leaves it.
Clients send model tensors, sample count and ledger (`wire`); the server computes each
client's ε from its own count of the rounds the client answered, refuses a report that
disagrees and screens every update (`server_app`). The job is the app's run config
(`runconfig`); `certs` makes a federation's TLS certificates and SuperNode keys; `deploy` starts
whole federations (TLS, SuperNode authentication) on 127.0.0.1 and runs one job on each.
"""

# The ServerApp's progress lines start "[flower <run>]"; the launcher relays them.
PROGRESS_LABEL = "flower"
