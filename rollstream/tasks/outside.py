"""The ``outside`` task source: tasks whose code needs more than the completion (issue 37).

Not part of ``builtin`` (the held-out split and the default mixture stay as they were): name it
in ``sampler.sources`` (``["builtin", "outside"]``). The asset tasks read read-only files the
executor mounts at ``/assets`` (``RewardSpec.assets``, consumers/executor/assets.py): a JSON dataset
and a directory of game levels, shipped in ``rollstream/tasks/assets/`` and pinned by digest (a
changed file is refused, never scored); they come from the installed package's own directory,
which every executor allows. The network tasks call a shop's HTTP API (``tasks-api:8080``,
rollstream/tasks/service.py, which the compose file and the tests start) through the egress proxy
(``RewardSpec.network``): the executor must allow the host (``executor.egress_allowed``) and run
its proxies on a network where the service is (``executor.egress_network``).
"""

from __future__ import annotations

from rollstream.schemas.events import Asset, RewardSpec
from rollstream.schemas.tasks import TaskSpec
from rollstream.tasks.service import HOST, PORT
from rollstream.tasks.sources import ASSETS_DIR

FAMILY = "outside"
SERVICE = f"{HOST}:{PORT}"  # the shop's API (rollstream/tasks/service.py): the network tasks' one host
# Pinned: tests/consumers/executor/test_assets.py checks them against the shipped files.
SALES_DIGEST = "sha256:1ce93064036398ae8c3953850f81a67ae27b8cb636c2d18fe1dade220feb4c79"
LEVELS_DIGEST = "sha256:ce361cb5a21f4e23abe9fad64f0766e5c51d27e7e6d516880d2d9f1af766b809"

SALES = ("`/assets/sales.json` holds a JSON object whose `rows` is a list of sales records, each "
         "`{\"region\": str, \"month\": \"YYYY-MM\", \"units\": int, \"price\": float}`.")
LEVELS = ("`/assets/levels/` holds game levels as text files `<name>.txt`: rows of `#` (wall), `.` (floor), "
          "`@` (the player's start) and `$` (treasure).")


def sales() -> Asset:
    return Asset(path="sales.json", url=f"file://{ASSETS_DIR / 'sales.json'}", digest=SALES_DIGEST)


def levels() -> Asset:
    return Asset(path="levels", url=f"file://{ASSETS_DIR / 'levels'}", digest=LEVELS_DIGEST)


def _spec(name: str, context: str, ask: str, reward: RewardSpec, heldout: list[str], reference: str, wrong: str,
          difficulty: int) -> TaskSpec:
    return TaskSpec(
        task_id=f"{FAMILY}/{name}",
        family=FAMILY,
        prompt=f"{context}\n\n{ask}\n\nReturn the complete function in a ```python code block.",
        reward=reward,
        heldout_tests=heldout,
        reference_solution=reference,
        difficulty=difficulty,
        wrong_solutions=[wrong],
    )


def _task(name: str, context: str, ask: str, entry: str, tests: list[str], heldout: list[str], reference: str,
          asset: Asset, wrong: str) -> TaskSpec:
    reward = RewardSpec(entry_point=entry, tests=tests, assets=[asset], timeout_s=5.0)
    return _spec(name, context, ask, reward, heldout, reference, wrong, difficulty=2)


API = (f"A shop's HTTP API runs at `http://{SERVICE}` (JSON; use `urllib.request`, the proxy is set up): "
       "`GET /items` -> `{\"items\": [names]}`; `GET /items/<name>` -> `{\"name\", \"price\", \"stock\"}`; "
       "`GET /orders?page=N` -> `{\"orders\": [{\"item\", \"quantity\"}], \"next\": N + 1 or null}`, "
       "starting at page 0.")
GET = ("import json\nimport urllib.request\n\ndef _get(path):\n"
       f"    with urllib.request.urlopen('http://{SERVICE}' + path, timeout=10) as r:\n"
       "        return json.load(r)\n\n")
ORDERS = ("def _orders():\n    page, out = 0, []\n    while page is not None:\n        got = _get(f'/orders?page={page}')\n"
          "        out += got['orders']\n        page = got['next']\n    return out\n\n")


def _network_task(name: str, ask: str, entry: str, tests: list[str], heldout: list[str], reference: str,
                  wrong: str) -> TaskSpec:
    reward = RewardSpec(entry_point=entry, tests=tests, network=[SERVICE], timeout_s=20.0)
    return _spec(name, API, ask, reward, heldout, reference, wrong, difficulty=3)


def network_tasks() -> list[TaskSpec]:
    """Tasks that call the shop's API (rollstream/tasks/service.py) through the egress proxy."""
    return [
        _network_task("item_price", "Write a Python function `item_price(name: str) -> float` that returns the "
                      "item's price from the API.", "item_price",
                      ["assert item_price('cheese') == 7.8", "assert item_price('eggs') == 3.05"],
                      ["assert item_price('apple') == 0.5"],
                      GET + "def item_price(name: str) -> float:\n    return _get(f'/items/{name}')['price']\n",
                      GET + "def item_price(name: str) -> float:\n    return _get(f'/items/{name}')['stock']\n"),
        _network_task("in_stock", "Write a Python function `in_stock() -> list[str]` that returns the names of "
                      "the items whose stock is above 0, sorted.", "in_stock",
                      ["assert in_stock() == ['apple', 'bread', 'cheese', 'eggs']"], [],
                      GET + "def in_stock() -> list[str]:\n"
                            "    return sorted(n for n in _get('/items')['items'] if _get(f'/items/{n}')['stock'] > 0)\n",
                      GET + "def in_stock() -> list[str]:\n    return sorted(_get('/items')['items'])\n"),
        _network_task("units_ordered", "Write a Python function `units_ordered(item: str) -> int` that returns "
                      "how many units of `item` all the orders ask for, over every page.", "units_ordered",
                      ["assert units_ordered('apple') == 15", "assert units_ordered('dates') == 0"],
                      ["assert units_ordered('bread') == 3"],
                      GET + ORDERS + "def units_ordered(item: str) -> int:\n"
                                     "    return sum(o['quantity'] for o in _orders() if o['item'] == item)\n",
                      GET + "def units_ordered(item: str) -> int:\n"
                            "    return sum(o['quantity'] for o in _get('/orders?page=0')['orders'] if o['item'] == item)\n"),
        _network_task("order_value", "Write a Python function `order_value() -> float` that returns the value of "
                      "all the orders (quantity times the item's price, summed over every page), rounded to 2 "
                      "decimals.", "order_value", ["assert order_value() == 58.65"], [],
                      GET + ORDERS + "def order_value() -> float:\n"
                                     "    return round(sum(o['quantity'] * _get(f\"/items/{o['item']}\")['price'] "
                                     "for o in _orders()), 2)\n",
                      GET + ORDERS + "def order_value() -> float:\n"
                                     "    return round(sum(o['quantity'] for o in _orders()), 2)\n"),
    ]


def outside_tasks() -> list[TaskSpec]:
    return asset_tasks() + network_tasks()


def asset_tasks() -> list[TaskSpec]:
    load = "import json\n\ndef _rows():\n    with open('/assets/sales.json') as f:\n        return json.load(f)['rows']\n\n"
    return [
        _task("total_units", SALES,
              "Write a Python function `total_units(region: str) -> int` that returns the units sold in "
              "`region` over every month of that file (0 for a region it does not list).",
              "total_units", ["assert total_units('north') == 318", "assert total_units('nowhere') == 0"],
              ["assert total_units('east') == 545", "assert total_units('west') == 509"],
              load + "def total_units(region: str) -> int:\n"
                     "    return sum(r['units'] for r in _rows() if r['region'] == region)\n",
              sales(),
              load + "def total_units(region: str) -> int:\n"
                     "    return sum(1 for r in _rows() if r['region'] == region)\n"),
        _task("best_month", SALES,
              "Write a Python function `best_month() -> str` that returns the month with the highest "
              "revenue (the sum of units * price over its records).",
              "best_month", ["assert best_month() == '2026-01'"], ["assert isinstance(best_month(), str)"],
              load + "def best_month() -> str:\n    revenue = {}\n    for r in _rows():\n"
                     "        revenue[r['month']] = revenue.get(r['month'], 0) + r['units'] * r['price']\n"
                     "    return max(sorted(revenue), key=revenue.__getitem__)\n",
              sales(),
              load + "def best_month() -> str:\n    return max(r['month'] for r in _rows())\n"),
        _task("mean_price", SALES,
              "Write a Python function `mean_price(region: str) -> float` that returns the mean `price` of "
              "`region`'s records, rounded to 2 decimals.",
              "mean_price", ["assert mean_price('north') == 10.23"], ["assert mean_price('west') == 7.05"],
              load + "def mean_price(region: str) -> float:\n"
                     "    prices = [r['price'] for r in _rows() if r['region'] == region]\n"
                     "    return round(sum(prices) / len(prices), 2)\n",
              sales(),
              load + "def mean_price(region: str) -> float:\n"
                     "    return round(max(r['price'] for r in _rows() if r['region'] == region), 2)\n"),
        _task("count_walls", LEVELS,
              "Write a Python function `count_walls(level: str) -> int` that returns how many wall cells level "
              "`level` (the file `/assets/levels/<level>.txt`) has.",
              "count_walls", ["assert count_walls('1') == 22", "assert count_walls('3') == 17"],
              ["assert count_walls('2') == 30"],
              "def count_walls(level: str) -> int:\n    with open(f'/assets/levels/{level}.txt') as f:\n"
              "        return f.read().count('#')\n",
              levels(),
              "def count_walls(level: str) -> int:\n    with open(f'/assets/levels/{level}.txt') as f:\n"
              "        return len(f.read().splitlines())\n"),
        _task("player_start", LEVELS,
              "Write a Python function `player_start(level: str) -> tuple[int, int]` that returns the (row, "
              "column) of the player's start `@` in level `level` (the file `/assets/levels/<level>.txt`), "
              "both counted from 0.",
              "player_start", ["assert player_start('1') == (1, 3)", "assert player_start('2') == (1, 1)"],
              ["assert player_start('3') == (1, 1)"],
              "def player_start(level: str) -> tuple[int, int]:\n"
              "    with open(f'/assets/levels/{level}.txt') as f:\n"
              "        for row, line in enumerate(f.read().splitlines()):\n"
              "            if '@' in line:\n                return (row, line.index('@'))\n"
              "    raise ValueError(level)\n",
              levels(),
              "def player_start(level: str) -> tuple[int, int]:\n"
              "    with open(f'/assets/levels/{level}.txt') as f:\n"
              "        for row, line in enumerate(f.read().splitlines()):\n"
              "            if '@' in line:\n                return (line.index('@'), row)\n"
              "    raise ValueError(level)\n"),
    ]
