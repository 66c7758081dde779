"""Build the bundled text-to-SQL data: a small shop database and question/SQL pairs.

    python scripts/build_data/sql.py [--out DIR] [--seed N]

writes `shop.sqlite` (6 tables with foreign keys, about 7,000 rows), `train.jsonl` and
`test.jsonl` (one {"id", "db_id", "skill", "question", "query"} object per line). Everything
comes from one seeded `random.Random`, so the build is deterministic: the committed files are
this script's output with the default seed. Each template family contributes every fifth
instance to the test split. Every reference query returns a non-empty result (checked here).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DB_ID = "shop"
OUT_DIR = Path(__file__).resolve().parents[2] / "src" / "mrtpo" / "data" / "sql"
SEED = 0
PER_TEMPLATE = 10  # instances kept per template family
TEST_EVERY = 5  # instance i of a family goes to test when i % TEST_EVERY == TEST_EVERY - 1

SCHEMA = [
    "CREATE TABLE suppliers (\nsupplier_id INTEGER PRIMARY KEY,\nname TEXT,\ncountry TEXT\n)",
    "CREATE TABLE products (\nproduct_id INTEGER PRIMARY KEY,\nname TEXT,\ncategory TEXT,\n"
    "price REAL,\nstock INTEGER,\nsupplier_id INTEGER REFERENCES suppliers(supplier_id)\n)",
    "CREATE TABLE customers (\ncustomer_id INTEGER PRIMARY KEY,\nname TEXT,\ncity TEXT,\n"
    "country TEXT,\nsignup_year INTEGER\n)",
    "CREATE TABLE orders (\norder_id INTEGER PRIMARY KEY,\n"
    "customer_id INTEGER REFERENCES customers(customer_id),\norder_date TEXT,\nstatus TEXT\n)",
    "CREATE TABLE order_items (\norder_id INTEGER REFERENCES orders(order_id),\n"
    "product_id INTEGER REFERENCES products(product_id),\nquantity INTEGER,\n"
    "PRIMARY KEY (order_id, product_id)\n)",
    "CREATE TABLE reviews (\nreview_id INTEGER PRIMARY KEY,\n"
    "product_id INTEGER REFERENCES products(product_id),\n"
    "customer_id INTEGER REFERENCES customers(customer_id),\nrating INTEGER\n)",
]
TABLES = ["suppliers", "products", "customers", "orders", "order_items", "reviews"]

CITIES = {
    "France": ["Paris", "Lyon", "Nice"],
    "Germany": ["Berlin", "Munich", "Hamburg"],
    "Italy": ["Rome", "Milan", "Turin"],
    "Spain": ["Madrid", "Seville", "Valencia"],
    "Japan": ["Tokyo", "Osaka", "Kyoto"],
    "Canada": ["Toronto", "Montreal", "Vancouver"],
    "Brazil": ["Recife", "Salvador", "Curitiba"],
    "Kenya": ["Nairobi", "Mombasa"],
}
NOUNS = {
    "books": ["Atlas", "Novel", "Cookbook", "Diary", "Guide"],
    "toys": ["Puzzle", "Robot", "Kite", "Yoyo", "Train"],
    "garden": ["Rake", "Hose", "Planter", "Shovel", "Lantern"],
    "kitchen": ["Kettle", "Skillet", "Blender", "Teapot", "Grater"],
    "sports": ["Racket", "Helmet", "Ball", "Glove", "Skates"],
    "music": ["Guitar", "Drum", "Flute", "Ukulele", "Harmonica"],
    "office": ["Stapler", "Notebook", "Lamp", "Binder", "Marker"],
    "beauty": ["Soap", "Lotion", "Brush", "Mirror", "Perfume"],
}
ADJECTIVES = [
    "Blue",
    "Red",
    "Green",
    "Classic",
    "Mini",
    "Deluxe",
    "Smart",
    "Silver",
    "Golden",
    "Rapid",
    "Quiet",
    "Bright",
]
FIRST = [
    "Ada",
    "Ben",
    "Chloe",
    "Dan",
    "Eva",
    "Farid",
    "Gina",
    "Hugo",
    "Ines",
    "Jon",
    "Kira",
    "Liam",
    "Mia",
    "Nora",
    "Omar",
    "Pia",
    "Quinn",
    "Rosa",
    "Sam",
    "Tara",
    "Uma",
    "Victor",
    "Wen",
    "Yara",
    "Zoe",
]
LAST = [
    "Adams",
    "Brown",
    "Costa",
    "Diaz",
    "Evans",
    "Fischer",
    "Garcia",
    "Hill",
    "Ito",
    "Jones",
    "Kim",
    "Lopez",
    "Moreau",
    "Novak",
    "Okafor",
    "Park",
    "Rossi",
    "Silva",
    "Tanaka",
    "Weber",
]
SUPPLIER_WORDS = [
    "Acme",
    "Nova",
    "Orbit",
    "Pioneer",
    "Summit",
    "Vertex",
    "Harbor",
    "Maple",
    "Cedar",
    "Atlas",
    "Zenith",
    "Comet",
]
STATUSES = ["delivered"] * 12 + ["shipped"] * 3 + ["pending"] * 3 + ["cancelled"] * 2
YEARS = [2022, 2023, 2024]

N_SUPPLIERS, N_PRODUCTS, N_CUSTOMERS, N_ORDERS, N_REVIEWS = 24, 150, 400, 1600, 700


def make_rows(rng: random.Random) -> dict[str, list[tuple]]:
    """Every table's rows, drawn from `rng` in a fixed order."""
    supplier_countries = sorted(rng.sample(sorted(CITIES), 6))  # two countries have none
    supplier_names = rng.sample(
        [f"{a} {b}" for a in SUPPLIER_WORDS for b in ("Trading", "Goods", "Supply")], N_SUPPLIERS
    )
    suppliers = [
        (i + 1, name, rng.choice(supplier_countries)) for i, name in enumerate(supplier_names)
    ]

    names = rng.sample(
        [
            (f"{adj} {noun}", cat)
            for cat, nouns in NOUNS.items()
            for noun in nouns
            for adj in ADJECTIVES
        ],
        N_PRODUCTS,
    )
    cents = rng.sample(range(199, 20000), N_PRODUCTS)  # distinct prices: no ties when ordering
    products = [
        (i + 1, name, cat, cents[i] / 100, rng.randint(0, 200), rng.randint(1, N_SUPPLIERS))
        for i, (name, cat) in enumerate(names)
    ]

    city_country = [(city, country) for country, cities in CITIES.items() for city in cities]
    people = rng.sample([f"{f} {last}" for f in FIRST for last in LAST], N_CUSTOMERS)
    customers = []
    for i, name in enumerate(people):
        city, country = rng.choice(city_country)
        customers.append((i + 1, name, city, country, rng.randint(2015, 2024)))

    orders, items = [], []
    for i in range(N_ORDERS):
        date = f"{rng.choice(YEARS)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        orders.append((i + 1, rng.randint(1, N_CUSTOMERS), date, rng.choice(STATUSES)))
        for product_id in sorted(rng.sample(range(1, N_PRODUCTS + 1), rng.randint(1, 4))):
            items.append((i + 1, product_id, rng.randint(1, 5)))

    pairs = rng.sample(
        [(p, c) for p in range(1, N_PRODUCTS + 1) for c in range(1, N_CUSTOMERS + 1)], N_REVIEWS
    )
    reviews = [
        (i + 1, p, c, rng.choice([1, 2, 3, 4, 4, 5, 5, 5])) for i, (p, c) in enumerate(pairs)
    ]
    return {
        "suppliers": suppliers,
        "products": products,
        "customers": customers,
        "orders": orders,
        "order_items": items,
        "reviews": reviews,
    }


def write_database(path: Path, rows: dict[str, list[tuple]]) -> None:
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    try:
        for statement in SCHEMA:
            conn.execute(statement)
        for table in TABLES:
            width = len(rows[table][0])
            conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * width)})", rows[table])
        conn.commit()
        conn.execute("VACUUM")
    finally:
        conn.close()


# -- question templates ------------------------------------------------------------------
# Each family yields (question, query) candidates in a fixed order; the first PER_TEMPLATE with
# a non-empty result are kept. A family is one `Family` entry in `FAMILIES`.

Candidates = Iterator[tuple[str, str]]
Values = dict[str, Any]


@dataclass(frozen=True)
class Family:
    """A template family: where its values come from and the (question, query) pairs they fill.

    `over` and `pick` map a placeholder to its values: the name of a list in `value_pools`, or
    the values themselves. Candidates come from nested loops over `over` (first entry outermost,
    each loop shuffled as it starts), all of it run `repeat` times; for each combination, one
    `rng.choice` per `pick` entry (in order), then `derive` adds values computed from those, and
    every pair in `templates` is filled in with `str.format`.
    """

    skill: str
    templates: Sequence[tuple[str, str]]
    over: Mapping[str, str | Sequence[Any]] = field(default_factory=dict)
    pick: Mapping[str, str | Sequence[Any]] = field(default_factory=dict)
    derive: Callable[[Values], Values] | None = None
    repeat: int = 1


ROUND_PRICES = [float(p) for p in range(20, 190, 5)]  # whole-dollar price thresholds

# fmt: off
FAMILIES = [
    # -- filter
    Family("filter", over={"city": "cities"}, templates=[
        ("What are the names of the customers who live in {city}?",
         "SELECT name FROM customers WHERE city = '{city}'"),
    ]),
    Family("filter", over={"cat": "categories", "stock": [20, 50, 100]}, templates=[
        ("List the names of the {cat} products with more than {stock} items in stock.",
         "SELECT name FROM products WHERE category = '{cat}' AND stock > {stock}"),
    ]),
    Family("filter", over={"status": "statuses", "year": "years"}, templates=[
        ("Give the ids of the orders with status '{status}' placed in {year}.",
         "SELECT order_id FROM orders WHERE status = '{status}' AND order_date LIKE '{year}-%'"),
    ]),
    Family("filter", over={"country": "countries"}, templates=[
        ("What are the names of the suppliers based in {country}?",
         "SELECT name FROM suppliers WHERE country = '{country}'"),
    ]),
    Family("filter", over={"country": "countries", "year": "signup_years"}, templates=[
        ("Which customers from {country} signed up in {year}? Give their names.",
         "SELECT name FROM customers WHERE country = '{country}' AND signup_year = {year}"),
    ]),
    # -- comparison
    Family("comparison", over={"price": "prices"}, templates=[
        ("What are the names of the products that cost more than {price} dollars?",
         "SELECT name FROM products WHERE price > {price}"),
    ]),
    Family("comparison", over={"price": "prices"}, templates=[
        ("What are the names of the products that cost at least {price} dollars?",
         "SELECT name FROM products WHERE price >= {price}"),
    ]),
    Family("comparison", over={"stock": "stocks"}, templates=[
        ("Which products have fewer than {stock} items in stock? Give their names.",
         "SELECT name FROM products WHERE stock < {stock}"),
    ]),
    Family("comparison", over={"stock": "stocks"}, templates=[
        ("Which products have at most {stock} items in stock? Give their names.",
         "SELECT name FROM products WHERE stock <= {stock}"),
    ]),
    Family("comparison", over={"city": "cities"}, pick={"year": range(2016, 2024)}, templates=[
        ("Which customers from {city} signed up before {year}? Give their names.",
         "SELECT name FROM customers WHERE city = '{city}' AND signup_year < {year}"),
    ]),
    Family("comparison", repeat=40,
           pick={"year": "years", "month": range(1, 13), "day": range(1, 29)}, templates=[
        ("How many orders were placed after {year}-{month:02d}-{day:02d}?",
         "SELECT COUNT(*) FROM orders WHERE order_date > '{year}-{month:02d}-{day:02d}'"),
    ]),
    # -- between
    Family("between", repeat=40, pick={"low": ROUND_PRICES, "step": [5.0, 10.0, 15.0, 20.0]},
           derive=lambda v: {"high": v["low"] + v["step"]}, templates=[
        ("What are the names of the products priced between {low} and {high} dollars, inclusive?",
         "SELECT name FROM products WHERE price BETWEEN {low} AND {high}"),
    ]),
    Family("between", over={"city": "cities"}, pick={"first": range(2015, 2022)},
           derive=lambda v: {"last": v["first"] + 3}, templates=[
        ("Which customers from {city} signed up between {first} and {last}, inclusive? Give their names.",
         "SELECT name FROM customers WHERE city = '{city}' AND signup_year BETWEEN {first} AND {last}"),
    ]),
    Family("between", repeat=40, pick={"year": "years", "month": range(1, 12)},
           derive=lambda v: {"next_month": v["month"] + 1}, templates=[
        ("How many orders were placed between {year}-{month:02d}-01 and {year}-{next_month:02d}-15, inclusive?",
         "SELECT COUNT(*) FROM orders "
         "WHERE order_date BETWEEN '{year}-{month:02d}-01' AND '{year}-{next_month:02d}-15'"),
    ]),
    # -- join
    Family("join", over={"country": "countries", "cat": "categories"}, templates=[
        ("What are the names of the {cat} products supplied by suppliers from {country}?",
         "SELECT T1.name FROM products AS T1 JOIN suppliers AS T2 ON T1.supplier_id = T2.supplier_id "
         "WHERE T2.country = '{country}' AND T1.category = '{cat}'"),
    ]),
    Family("join", over={"name": "customers"}, templates=[
        ("What are the ids of the orders placed by {name}?",
         "SELECT T1.order_id FROM orders AS T1 JOIN customers AS T2 ON T1.customer_id = T2.customer_id "
         "WHERE T2.name = '{name}'"),
    ]),
    Family("join", over={"name": "customers"}, templates=[
        ("Which products has {name} ordered? Give their distinct names.",
         "SELECT DISTINCT T3.name FROM customers AS T1 JOIN orders AS T2 ON T1.customer_id = T2.customer_id "
         "JOIN order_items AS T4 ON T2.order_id = T4.order_id JOIN products AS T3 ON T4.product_id = T3.product_id "
         "WHERE T1.name = '{name}'"),
    ]),
    Family("join", over={"product": "products"}, pick={"rating": [4, 5]}, templates=[
        ("What are the names of the customers who rated the product '{product}' {rating} or more?",
         "SELECT T2.name FROM reviews AS T1 JOIN customers AS T2 ON T1.customer_id = T2.customer_id "
         "JOIN products AS T3 ON T1.product_id = T3.product_id WHERE T3.name = '{product}' AND T1.rating >= {rating}"),
    ]),
    Family("join", over={"product": "products"}, pick={"status": ["shipped", "pending"]}, templates=[
        ("List the dates of the {status} orders that include the product '{product}'.",
         "SELECT T1.order_date FROM orders AS T1 JOIN order_items AS T2 ON T1.order_id = T2.order_id "
         "JOIN products AS T3 ON T2.product_id = T3.product_id WHERE T3.name = '{product}' AND T1.status = '{status}'"),
    ]),
    # -- aggregate
    Family("aggregate", over={"city": "cities"}, templates=[
        ("How many customers live in {city}?",
         "SELECT COUNT(*) FROM customers WHERE city = '{city}'"),
    ]),
    Family("aggregate", over={"cat": "categories"}, templates=[
        ("What is the average price of the products in the {cat} category?",
         "SELECT AVG(price) FROM products WHERE category = '{cat}'"),
        ("What is the total stock of the products in the {cat} category?",
         "SELECT SUM(stock) FROM products WHERE category = '{cat}'"),
    ]),
    Family("aggregate", over={"supplier": "suppliers"}, templates=[
        ("What is the highest price among the products supplied by {supplier}?",
         "SELECT MAX(T1.price) FROM products AS T1 JOIN suppliers AS T2 ON T1.supplier_id = T2.supplier_id "
         "WHERE T2.name = '{supplier}'"),
    ]),
    Family("aggregate", over={"product": "products"}, templates=[
        ("What is the lowest rating given to the product '{product}'?",
         "SELECT MIN(T1.rating) FROM reviews AS T1 JOIN products AS T2 ON T1.product_id = T2.product_id "
         "WHERE T2.name = '{product}'"),
    ]),
    Family("aggregate", over={"product": "products"}, templates=[
        ("How many units of '{product}' were ordered in total?",
         "SELECT SUM(T1.quantity) FROM order_items AS T1 JOIN products AS T2 ON T1.product_id = T2.product_id "
         "WHERE T2.name = '{product}'"),
    ]),
    Family("aggregate", over={"name": "customers"}, templates=[
        ("How many orders has {name} placed?",
         "SELECT COUNT(*) FROM orders AS T1 JOIN customers AS T2 ON T1.customer_id = T2.customer_id "
         "WHERE T2.name = '{name}'"),
    ]),
    # -- group_by
    Family("group_by", repeat=30, pick={"price": ROUND_PRICES}, templates=[
        ("For each category, how many products cost more than {price} dollars? Give the category and the count.",
         "SELECT category, COUNT(*) FROM products WHERE price > {price} GROUP BY category"),
    ]),
    Family("group_by", over={"year": "years", "month": range(1, 13)}, templates=[
        ("For each status, how many orders were placed in month {month:02d} of {year}? Give the status and the count.",
         "SELECT status, COUNT(*) FROM orders WHERE order_date LIKE '{year}-{month:02d}-%' GROUP BY status"),
    ]),
    Family("group_by", over={"country": "countries"}, templates=[
        ("For each city in {country}, how many customers live there? Give the city and the count.",
         "SELECT city, COUNT(*) FROM customers WHERE country = '{country}' GROUP BY city"),
    ]),
    Family("group_by", over={"country": "countries"}, templates=[
        ("For each supplier from {country}, what is the average price of its products? Give the supplier name and the average.",
         "SELECT T2.name, AVG(T1.price) FROM products AS T1 JOIN suppliers AS T2 ON T1.supplier_id = T2.supplier_id "
         "WHERE T2.country = '{country}' GROUP BY T2.supplier_id"),
    ]),
    # -- having
    Family("having", over={"n": range(8, 25)}, templates=[
        ("Which cities have more than {n} customers?",
         "SELECT city FROM customers GROUP BY city HAVING COUNT(*) > {n}"),
    ]),
    Family("having", over={"city": "cities"}, pick={"n": [4, 5, 6]}, templates=[
        ("Which customers from {city} have placed at least {n} orders? Give their names.",
         "SELECT T2.name FROM orders AS T1 JOIN customers AS T2 ON T1.customer_id = T2.customer_id "
         "WHERE T2.city = '{city}' GROUP BY T2.customer_id HAVING COUNT(*) >= {n}"),
    ]),
    Family("having", repeat=40, pick={"price": [p / 2 + 50 for p in ROUND_PRICES]}, templates=[
        ("Which categories have an average product price above {price} dollars?",
         "SELECT category FROM products GROUP BY category HAVING AVG(price) > {price}"),
    ]),
    Family("having", over={"cat": "categories", "n": [5, 6, 7]}, templates=[
        ("Which {cat} products have received at least {n} reviews? Give their names.",
         "SELECT T2.name FROM reviews AS T1 JOIN products AS T2 ON T1.product_id = T2.product_id "
         "WHERE T2.category = '{cat}' GROUP BY T2.product_id HAVING COUNT(*) >= {n}"),
    ]),
    # -- order_limit
    Family("order_limit", over={"cat": "categories", "k": [2, 3, 4, 5]}, templates=[
        ("What are the names of the {k} most expensive products in the {cat} category, most expensive first?",
         "SELECT name FROM products WHERE category = '{cat}' ORDER BY price DESC LIMIT {k}"),
    ]),
    Family("order_limit", over={"country": "countries", "k": [3, 4, 5]}, templates=[
        ("What are the names and prices of the {k} cheapest products from suppliers in {country}, cheapest first?",
         "SELECT T1.name, T1.price FROM products AS T1 JOIN suppliers AS T2 ON T1.supplier_id = T2.supplier_id "
         "WHERE T2.country = '{country}' ORDER BY T1.price LIMIT {k}"),
    ]),
    Family("order_limit", over={"cat": "categories"}, templates=[
        ("List the names of the products in the {cat} category in alphabetical order.",
         "SELECT name FROM products WHERE category = '{cat}' ORDER BY name"),
    ]),
    Family("order_limit", repeat=40, pick={"price": ROUND_PRICES}, templates=[
        ("What is the name of the most expensive product that costs less than {price} dollars?",
         "SELECT name FROM products WHERE price < {price} ORDER BY price DESC LIMIT 1"),
    ]),
    Family("order_limit", over={"name": "customers"}, templates=[
        ("List the dates of the orders placed by {name}, most recent first.",
         "SELECT T1.order_date FROM orders AS T1 JOIN customers AS T2 ON T1.customer_id = T2.customer_id "
         "WHERE T2.name = '{name}' ORDER BY T1.order_date DESC"),
    ]),
    # -- nested
    Family("nested", over={"cat": "categories"}, templates=[
        ("Which products in the {cat} category cost more than the average price of all products? Give their names.",
         "SELECT name FROM products WHERE category = '{cat}' AND price > (SELECT AVG(price) FROM products)"),
        ("Which {cat} products have more items in stock than the average stock of all products? Give their names.",
         "SELECT name FROM products WHERE category = '{cat}' AND stock > (SELECT AVG(stock) FROM products)"),
    ]),
    Family("nested", over={"city": "cities"}, pick={"status": ["cancelled", "pending"]}, templates=[
        ("Which customers from {city} have never had an order with status '{status}'? Give their names.",
         "SELECT name FROM customers WHERE city = '{city}' AND customer_id NOT IN "
         "(SELECT customer_id FROM orders WHERE status = '{status}')"),
    ]),
    Family("nested", over={"cat": "categories"}, pick={"country": "countries"}, templates=[
        ("Which {cat} products have never been reviewed by a customer from {country}? Give their names.",
         "SELECT name FROM products WHERE category = '{cat}' AND product_id NOT IN "
         "(SELECT T1.product_id FROM reviews AS T1 JOIN customers AS T2 ON T1.customer_id = T2.customer_id "
         "WHERE T2.country = '{country}')"),
    ]),
    Family("nested", over={"cat": "categories"}, templates=[
        ("Which products cost more than every product in the {cat} category? Give their names.",
         "SELECT name FROM products WHERE price > (SELECT MAX(price) FROM products WHERE category = '{cat}')"),
    ]),
    Family("nested", over={"cat": "categories"}, templates=[
        ("How many orders include the most expensive product of the {cat} category?",
         "SELECT COUNT(*) FROM order_items WHERE product_id = "
         "(SELECT product_id FROM products WHERE category = '{cat}' ORDER BY price DESC LIMIT 1)"),
    ]),
    # -- set_operation
    Family("set_operation", over={"year": "signup_years"}, templates=[
        ("Which countries have customers who signed up in {year} but no suppliers?",
         "SELECT country FROM customers WHERE signup_year = {year} EXCEPT SELECT country FROM suppliers"),
    ]),
    Family("set_operation", over={"cat": "categories"},
           pick={"price": [float(p) for p in range(4, 15)]}, templates=[
        ("What are the names of the products that are in the {cat} category or cost less than {price} dollars?",
         "SELECT name FROM products WHERE category = '{cat}' UNION SELECT name FROM products WHERE price < {price}"),
    ]),
    Family("set_operation", over={"city": "cities"}, templates=[
        ("Which customers from {city} have both written a review and placed a pending order? Give their names.",
         "SELECT T1.name FROM customers AS T1 JOIN reviews AS T2 ON T1.customer_id = T2.customer_id "
         "WHERE T1.city = '{city}' INTERSECT SELECT T1.name FROM customers AS T1 JOIN orders AS T2 "
         "ON T1.customer_id = T2.customer_id WHERE T1.city = '{city}' AND T2.status = 'pending'"),
    ]),
    Family("set_operation", over={"cat": "categories"}, templates=[
        ("Which {cat} products have been rated 5 but never rated 1? Give their names.",
         "SELECT T1.name FROM products AS T1 JOIN reviews AS T2 ON T1.product_id = T2.product_id "
         "WHERE T1.category = '{cat}' AND T2.rating = 5 EXCEPT SELECT T1.name FROM products AS T1 "
         "JOIN reviews AS T2 ON T1.product_id = T2.product_id WHERE T2.rating = 1"),
    ]),
]
# fmt: on


def _q(conn: sqlite3.Connection, sql: str) -> list[tuple]:
    return conn.execute(sql).fetchall()


def value_pools(conn: sqlite3.Connection) -> dict[str, list[Any]]:
    """The named value lists a family's `over` and `pick` refer to."""

    def column(sql: str) -> list[Any]:
        return [value for (value,) in _q(conn, sql)]

    return {
        "cities": [city for cities in CITIES.values() for city in cities],
        "countries": sorted(CITIES),
        "categories": sorted(NOUNS),
        "statuses": ["delivered", "shipped", "pending", "cancelled"],
        "years": YEARS,
        "signup_years": list(range(2015, 2025)),
        "prices": column("SELECT price FROM products ORDER BY product_id"),
        "stocks": column("SELECT DISTINCT stock FROM products ORDER BY stock"),
        "customers": column("SELECT name FROM customers ORDER BY customer_id"),
        "products": column("SELECT name FROM products ORDER BY product_id"),
        "suppliers": column("SELECT name FROM suppliers ORDER BY supplier_id"),
    }


def candidates(family: Family, pools: dict[str, list[Any]], rng: random.Random) -> Candidates:
    """`family`'s (question, query) candidates, drawing from `rng` only as they are taken."""

    def values_of(spec: str | Sequence[Any]) -> Sequence[Any]:
        return pools[spec] if isinstance(spec, str) else spec

    loops = [(name, values_of(spec)) for name, spec in family.over.items()]
    for _ in range(family.repeat):
        for values in _combinations(loops, rng):
            for name, spec in family.pick.items():
                values[name] = rng.choice(values_of(spec))
            if family.derive is not None:
                values.update(family.derive(values))
            for question, query in family.templates:
                yield question.format(**values), query.format(**values)


def _combinations(loops: list[tuple[str, Sequence[Any]]], rng: random.Random) -> Iterator[Values]:
    """Every combination of the loops' values; each loop is shuffled as it starts."""
    if not loops:
        yield {}
        return
    (name, values), inner = loops[0], loops[1:]
    order = list(values)
    rng.shuffle(order)
    for value in order:
        for rest in _combinations(inner, rng):
            yield {name: value, **rest}


def has_answer(rows: list[tuple]) -> bool:
    """A usable reference result: at least one row, and not only NULLs or zero counts."""
    return bool(rows) and any(value not in (None, 0) for row in rows for value in row)


def make_pairs(db_path: Path, rng: random.Random) -> tuple[list[dict], list[dict]]:
    """(train, test) question/SQL pairs, each family split TEST_EVERY-fold."""
    train, test = [], []
    conn = sqlite3.connect(db_path)
    try:
        pools = value_pools(conn)
        for family in FAMILIES:
            kept: list[tuple[str, str]] = []
            seen: set[str] = set()
            for question, query in candidates(family, pools, rng):
                if len(kept) == PER_TEMPLATE:
                    break
                if query in seen or not has_answer(_q(conn, query)):
                    continue
                seen.add(query)
                kept.append((question, query))
            for i, (question, query) in enumerate(kept):
                pair = {"skill": family.skill, "question": question, "query": query}
                (test if i % TEST_EVERY == TEST_EVERY - 1 else train).append(pair)
    finally:
        conn.close()
    for split, pairs in (("train", train), ("test", test)):
        for i, pair in enumerate(pairs):
            pair.update({"id": f"{DB_ID}-{split}-{i:04d}", "db_id": DB_ID})
    return train, test


def write_jsonl(path: Path, rows: list[dict]) -> None:
    keys = ["id", "db_id", "skill", "question", "query"]
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps({k: row[k] for k in keys}, ensure_ascii=False) + "\n")


def table_digest(db_path: Path) -> str:
    """SHA-256 over the schema and every table's rows (stable across SQLite file layouts)."""
    digest = hashlib.sha256()
    conn = sqlite3.connect(Path(db_path).resolve().as_uri() + "?mode=ro", uri=True)
    try:
        for (sql,) in conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' ORDER BY name"
        ):
            digest.update(sql.encode())
        for table in TABLES:
            for row in conn.execute(f"SELECT * FROM {table} ORDER BY rowid"):
                digest.update(repr(row).encode())
    finally:
        conn.close()
    return digest.hexdigest()


def build(out_dir: Path = OUT_DIR, seed: int = SEED) -> dict[str, Path]:
    """Write shop.sqlite, train.jsonl and test.jsonl into `out_dir`; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paths = {
        "db": out_dir / f"{DB_ID}.sqlite",
        "train": out_dir / "train.jsonl",
        "test": out_dir / "test.jsonl",
    }
    write_database(paths["db"], make_rows(rng))
    train, test = make_pairs(paths["db"], rng)
    write_jsonl(paths["train"], train)
    write_jsonl(paths["test"], test)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=OUT_DIR, help="output folder (default: src/mrtpo/data/sql)"
    )
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    paths = build(args.out, args.seed)
    for name, path in paths.items():
        print(f"{name}: {path} ({path.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
