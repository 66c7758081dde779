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
from collections.abc import Callable, Iterator
from pathlib import Path

DB_ID = "shop"
HERE = Path(__file__).resolve().parents[2] / "src" / "mrtpo" / "data" / "sql"
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
# a non-empty result are kept.

Candidates = Iterator[tuple[str, str]]


def _q(conn: sqlite3.Connection, sql: str) -> list[tuple]:
    return conn.execute(sql).fetchall()


def families(
    conn: sqlite3.Connection, rng: random.Random
) -> list[tuple[str, Callable[[], Candidates]]]:
    """(skill, candidate generator) for every template family."""
    cities = [c for cs in CITIES.values() for c in cs]
    countries = sorted(CITIES)
    categories = sorted(NOUNS)
    statuses = ["delivered", "shipped", "pending", "cancelled"]
    prices = [p for (p,) in _q(conn, "SELECT price FROM products ORDER BY product_id")]
    stocks = sorted({s for (s,) in _q(conn, "SELECT stock FROM products")})
    customers = [n for (n,) in _q(conn, "SELECT name FROM customers ORDER BY customer_id")]
    products = [n for (n,) in _q(conn, "SELECT name FROM products ORDER BY product_id")]
    suppliers = [n for (n,) in _q(conn, "SELECT name FROM suppliers ORDER BY supplier_id")]

    def shuffled(values: list) -> list:
        values = list(values)
        rng.shuffle(values)
        return values

    def round_price() -> float:
        return float(rng.choice(range(20, 190, 5)))

    def f_city() -> Candidates:
        for city in shuffled(cities):
            yield (
                f"What are the names of the customers who live in {city}?",
                f"SELECT name FROM customers WHERE city = '{city}'",
            )

    def f_category() -> Candidates:
        for cat in shuffled(categories):
            for stock in shuffled([20, 50, 100]):
                yield (
                    f"List the names of the {cat} products with more than {stock} items in stock.",
                    f"SELECT name FROM products WHERE category = '{cat}' AND stock > {stock}",
                )

    def f_status_year() -> Candidates:
        for status in shuffled(statuses):
            for year in shuffled(YEARS):
                yield (
                    f"Give the ids of the orders with status '{status}' placed in {year}.",
                    f"SELECT order_id FROM orders WHERE status = '{status}' AND order_date LIKE '{year}-%'",
                )

    def f_supplier_country() -> Candidates:
        for country in shuffled(countries):
            yield (
                f"What are the names of the suppliers based in {country}?",
                f"SELECT name FROM suppliers WHERE country = '{country}'",
            )

    def f_country_year() -> Candidates:
        for country in shuffled(countries):
            for year in shuffled(list(range(2015, 2025))):
                yield (
                    f"Which customers from {country} signed up in {year}? Give their names.",
                    f"SELECT name FROM customers WHERE country = '{country}' AND signup_year = {year}",
                )

    def c_more_than() -> Candidates:
        for price in shuffled(prices):
            yield (
                f"What are the names of the products that cost more than {price} dollars?",
                f"SELECT name FROM products WHERE price > {price}",
            )

    def c_at_least() -> Candidates:
        for price in shuffled(prices):
            yield (
                f"What are the names of the products that cost at least {price} dollars?",
                f"SELECT name FROM products WHERE price >= {price}",
            )

    def c_fewer() -> Candidates:
        for stock in shuffled(stocks):
            yield (
                f"Which products have fewer than {stock} items in stock? Give their names.",
                f"SELECT name FROM products WHERE stock < {stock}",
            )

    def c_at_most() -> Candidates:
        for stock in shuffled(stocks):
            yield (
                f"Which products have at most {stock} items in stock? Give their names.",
                f"SELECT name FROM products WHERE stock <= {stock}",
            )

    def c_city_before() -> Candidates:
        for city in shuffled(cities):
            year = rng.randint(2016, 2023)
            yield (
                f"Which customers from {city} signed up before {year}? Give their names.",
                f"SELECT name FROM customers WHERE city = '{city}' AND signup_year < {year}",
            )

    def c_orders_after() -> Candidates:
        for _ in range(40):
            date = f"{rng.choice(YEARS)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
            yield (
                f"How many orders were placed after {date}?",
                f"SELECT COUNT(*) FROM orders WHERE order_date > '{date}'",
            )

    def b_price() -> Candidates:
        for _ in range(40):
            low = round_price()
            high = low + float(rng.choice([5, 10, 15, 20]))
            yield (
                f"What are the names of the products priced between {low} and {high} dollars, inclusive?",
                f"SELECT name FROM products WHERE price BETWEEN {low} AND {high}",
            )

    def b_signup() -> Candidates:
        for city in shuffled(cities):
            first = rng.randint(2015, 2021)
            yield (
                f"Which customers from {city} signed up between {first} and {first + 3}, inclusive? Give their names.",
                f"SELECT name FROM customers WHERE city = '{city}' AND signup_year BETWEEN {first} AND {first + 3}",
            )

    def b_dates() -> Candidates:
        for _ in range(40):
            year, month = rng.choice(YEARS), rng.randint(1, 11)
            start, end = f"{year}-{month:02d}-01", f"{year}-{month + 1:02d}-15"
            yield (
                f"How many orders were placed between {start} and {end}, inclusive?",
                f"SELECT COUNT(*) FROM orders WHERE order_date BETWEEN '{start}' AND '{end}'",
            )

    def j_supplier_country() -> Candidates:
        for country in shuffled(countries):
            for cat in shuffled(categories):
                yield (
                    f"What are the names of the {cat} products supplied by suppliers from {country}?",
                    "SELECT T1.name FROM products AS T1 JOIN suppliers AS T2 ON T1.supplier_id = T2.supplier_id "
                    f"WHERE T2.country = '{country}' AND T1.category = '{cat}'",
                )

    def j_orders_of() -> Candidates:
        for name in shuffled(customers):
            yield (
                f"What are the ids of the orders placed by {name}?",
                "SELECT T1.order_id FROM orders AS T1 JOIN customers AS T2 ON T1.customer_id = T2.customer_id "
                f"WHERE T2.name = '{name}'",
            )

    def j_products_of() -> Candidates:
        for name in shuffled(customers):
            yield (
                f"Which products has {name} ordered? Give their distinct names.",
                "SELECT DISTINCT T3.name FROM customers AS T1 JOIN orders AS T2 ON T1.customer_id = T2.customer_id "
                "JOIN order_items AS T4 ON T2.order_id = T4.order_id JOIN products AS T3 ON T4.product_id = T3.product_id "
                f"WHERE T1.name = '{name}'",
            )

    def j_reviewers() -> Candidates:
        for product in shuffled(products):
            rating = rng.choice([4, 5])
            yield (
                f"What are the names of the customers who rated the product '{product}' {rating} or more?",
                "SELECT T2.name FROM reviews AS T1 JOIN customers AS T2 ON T1.customer_id = T2.customer_id "
                f"JOIN products AS T3 ON T1.product_id = T3.product_id WHERE T3.name = '{product}' AND T1.rating >= {rating}",
            )

    def j_order_dates() -> Candidates:
        for product in shuffled(products):
            status = rng.choice(["shipped", "pending"])
            yield (
                f"List the dates of the {status} orders that include the product '{product}'.",
                "SELECT T1.order_date FROM orders AS T1 JOIN order_items AS T2 ON T1.order_id = T2.order_id "
                f"JOIN products AS T3 ON T2.product_id = T3.product_id WHERE T3.name = '{product}' AND T1.status = '{status}'",
            )

    def a_count_city() -> Candidates:
        for city in shuffled(cities):
            yield (
                f"How many customers live in {city}?",
                f"SELECT COUNT(*) FROM customers WHERE city = '{city}'",
            )

    def a_avg_category() -> Candidates:
        for cat in shuffled(categories):
            yield (
                f"What is the average price of the products in the {cat} category?",
                f"SELECT AVG(price) FROM products WHERE category = '{cat}'",
            )
            yield (
                f"What is the total stock of the products in the {cat} category?",
                f"SELECT SUM(stock) FROM products WHERE category = '{cat}'",
            )

    def a_max_supplier() -> Candidates:
        for supplier in shuffled(suppliers):
            yield (
                f"What is the highest price among the products supplied by {supplier}?",
                "SELECT MAX(T1.price) FROM products AS T1 JOIN suppliers AS T2 ON T1.supplier_id = T2.supplier_id "
                f"WHERE T2.name = '{supplier}'",
            )

    def a_min_rating() -> Candidates:
        for product in shuffled(products):
            yield (
                f"What is the lowest rating given to the product '{product}'?",
                "SELECT MIN(T1.rating) FROM reviews AS T1 JOIN products AS T2 ON T1.product_id = T2.product_id "
                f"WHERE T2.name = '{product}'",
            )

    def a_units() -> Candidates:
        for product in shuffled(products):
            yield (
                f"How many units of '{product}' were ordered in total?",
                "SELECT SUM(T1.quantity) FROM order_items AS T1 JOIN products AS T2 ON T1.product_id = T2.product_id "
                f"WHERE T2.name = '{product}'",
            )

    def a_orders_count() -> Candidates:
        for name in shuffled(customers):
            yield (
                f"How many orders has {name} placed?",
                "SELECT COUNT(*) FROM orders AS T1 JOIN customers AS T2 ON T1.customer_id = T2.customer_id "
                f"WHERE T2.name = '{name}'",
            )

    def g_category_count() -> Candidates:
        for _ in range(30):
            price = round_price()
            yield (
                f"For each category, how many products cost more than {price} dollars? Give the category and the count.",
                f"SELECT category, COUNT(*) FROM products WHERE price > {price} GROUP BY category",
            )

    def g_status_year() -> Candidates:
        for year in shuffled(YEARS):
            for month in shuffled(list(range(1, 13))):
                yield (
                    f"For each status, how many orders were placed in month {month:02d} of {year}? Give the status and the count.",
                    f"SELECT status, COUNT(*) FROM orders WHERE order_date LIKE '{year}-{month:02d}-%' GROUP BY status",
                )

    def g_city_country() -> Candidates:
        for country in shuffled(countries):
            yield (
                f"For each city in {country}, how many customers live there? Give the city and the count.",
                f"SELECT city, COUNT(*) FROM customers WHERE country = '{country}' GROUP BY city",
            )

    def g_supplier_avg() -> Candidates:
        for country in shuffled(countries):
            yield (
                f"For each supplier from {country}, what is the average price of its products? Give the supplier name and the average.",
                "SELECT T2.name, AVG(T1.price) FROM products AS T1 JOIN suppliers AS T2 ON T1.supplier_id = T2.supplier_id "
                f"WHERE T2.country = '{country}' GROUP BY T2.supplier_id",
            )

    def h_cities() -> Candidates:
        for n in shuffled(list(range(8, 25))):
            yield (
                f"Which cities have more than {n} customers?",
                f"SELECT city FROM customers GROUP BY city HAVING COUNT(*) > {n}",
            )

    def h_customers() -> Candidates:
        for city in shuffled(cities):
            n = rng.choice([4, 5, 6])
            yield (
                f"Which customers from {city} have placed at least {n} orders? Give their names.",
                "SELECT T2.name FROM orders AS T1 JOIN customers AS T2 ON T1.customer_id = T2.customer_id "
                f"WHERE T2.city = '{city}' GROUP BY T2.customer_id HAVING COUNT(*) >= {n}",
            )

    def h_categories() -> Candidates:
        for _ in range(40):
            price = round_price() / 2 + 50
            yield (
                f"Which categories have an average product price above {price} dollars?",
                f"SELECT category FROM products GROUP BY category HAVING AVG(price) > {price}",
            )

    def h_reviews() -> Candidates:
        for cat in shuffled(categories):
            for n in shuffled([5, 6, 7]):
                yield (
                    f"Which {cat} products have received at least {n} reviews? Give their names.",
                    "SELECT T2.name FROM reviews AS T1 JOIN products AS T2 ON T1.product_id = T2.product_id "
                    f"WHERE T2.category = '{cat}' GROUP BY T2.product_id HAVING COUNT(*) >= {n}",
                )

    def o_top_category() -> Candidates:
        for cat in shuffled(categories):
            for k in shuffled([2, 3, 4, 5]):
                yield (
                    f"What are the names of the {k} most expensive products in the {cat} category, most expensive first?",
                    f"SELECT name FROM products WHERE category = '{cat}' ORDER BY price DESC LIMIT {k}",
                )

    def o_cheapest_country() -> Candidates:
        for country in shuffled(countries):
            for k in shuffled([3, 4, 5]):
                yield (
                    f"What are the names and prices of the {k} cheapest products from suppliers in {country}, cheapest first?",
                    "SELECT T1.name, T1.price FROM products AS T1 JOIN suppliers AS T2 ON T1.supplier_id = T2.supplier_id "
                    f"WHERE T2.country = '{country}' ORDER BY T1.price LIMIT {k}",
                )

    def o_alphabetical() -> Candidates:
        for cat in shuffled(categories):
            yield (
                f"List the names of the products in the {cat} category in alphabetical order.",
                f"SELECT name FROM products WHERE category = '{cat}' ORDER BY name",
            )

    def o_below() -> Candidates:
        for _ in range(40):
            price = round_price()
            yield (
                f"What is the name of the most expensive product that costs less than {price} dollars?",
                f"SELECT name FROM products WHERE price < {price} ORDER BY price DESC LIMIT 1",
            )

    def o_recent() -> Candidates:
        for name in shuffled(customers):
            yield (
                f"List the dates of the orders placed by {name}, most recent first.",
                "SELECT T1.order_date FROM orders AS T1 JOIN customers AS T2 ON T1.customer_id = T2.customer_id "
                f"WHERE T2.name = '{name}' ORDER BY T1.order_date DESC",
            )

    def n_above_average() -> Candidates:
        for cat in shuffled(categories):
            yield (
                f"Which products in the {cat} category cost more than the average price of all products? Give their names.",
                f"SELECT name FROM products WHERE category = '{cat}' AND price > (SELECT AVG(price) FROM products)",
            )
            yield (
                f"Which {cat} products have more items in stock than the average stock of all products? Give their names.",
                f"SELECT name FROM products WHERE category = '{cat}' AND stock > (SELECT AVG(stock) FROM products)",
            )

    def n_never_status() -> Candidates:
        for city in shuffled(cities):
            status = rng.choice(["cancelled", "pending"])
            yield (
                f"Which customers from {city} have never had an order with status '{status}'? Give their names.",
                f"SELECT name FROM customers WHERE city = '{city}' AND customer_id NOT IN "
                f"(SELECT customer_id FROM orders WHERE status = '{status}')",
            )

    def n_not_reviewed() -> Candidates:
        for cat in shuffled(categories):
            country = rng.choice(countries)
            yield (
                f"Which {cat} products have never been reviewed by a customer from {country}? Give their names.",
                f"SELECT name FROM products WHERE category = '{cat}' AND product_id NOT IN "
                "(SELECT T1.product_id FROM reviews AS T1 JOIN customers AS T2 ON T1.customer_id = T2.customer_id "
                f"WHERE T2.country = '{country}')",
            )

    def n_above_every() -> Candidates:
        for cat in shuffled(categories):
            yield (
                f"Which products cost more than every product in the {cat} category? Give their names.",
                f"SELECT name FROM products WHERE price > (SELECT MAX(price) FROM products WHERE category = '{cat}')",
            )

    def n_top_product_orders() -> Candidates:
        for cat in shuffled(categories):
            yield (
                f"How many orders include the most expensive product of the {cat} category?",
                "SELECT COUNT(*) FROM order_items WHERE product_id = "
                f"(SELECT product_id FROM products WHERE category = '{cat}' ORDER BY price DESC LIMIT 1)",
            )

    def s_countries() -> Candidates:
        for year in shuffled(list(range(2015, 2025))):
            yield (
                f"Which countries have customers who signed up in {year} but no suppliers?",
                f"SELECT country FROM customers WHERE signup_year = {year} EXCEPT SELECT country FROM suppliers",
            )

    def s_union() -> Candidates:
        for cat in shuffled(categories):
            price = float(rng.choice(range(4, 15)))
            yield (
                f"What are the names of the products that are in the {cat} category or cost less than {price} dollars?",
                f"SELECT name FROM products WHERE category = '{cat}' UNION SELECT name FROM products WHERE price < {price}",
            )

    def s_intersect() -> Candidates:
        for city in shuffled(cities):
            yield (
                f"Which customers from {city} have both written a review and placed a pending order? Give their names.",
                "SELECT T1.name FROM customers AS T1 JOIN reviews AS T2 ON T1.customer_id = T2.customer_id "
                f"WHERE T1.city = '{city}' INTERSECT SELECT T1.name FROM customers AS T1 JOIN orders AS T2 "
                f"ON T1.customer_id = T2.customer_id WHERE T1.city = '{city}' AND T2.status = 'pending'",
            )

    def s_except() -> Candidates:
        for cat in shuffled(categories):
            yield (
                f"Which {cat} products have been rated 5 but never rated 1? Give their names.",
                "SELECT T1.name FROM products AS T1 JOIN reviews AS T2 ON T1.product_id = T2.product_id "
                f"WHERE T1.category = '{cat}' AND T2.rating = 5 EXCEPT SELECT T1.name FROM products AS T1 "
                f"JOIN reviews AS T2 ON T1.product_id = T2.product_id WHERE T2.rating = 1",
            )

    return [
        ("filter", f_city), ("filter", f_category), ("filter", f_status_year),
        ("filter", f_supplier_country), ("filter", f_country_year),
        ("comparison", c_more_than), ("comparison", c_at_least), ("comparison", c_fewer),
        ("comparison", c_at_most), ("comparison", c_city_before), ("comparison", c_orders_after),
        ("between", b_price), ("between", b_signup), ("between", b_dates),
        ("join", j_supplier_country), ("join", j_orders_of), ("join", j_products_of),
        ("join", j_reviewers), ("join", j_order_dates),
        ("aggregate", a_count_city), ("aggregate", a_avg_category), ("aggregate", a_max_supplier),
        ("aggregate", a_min_rating), ("aggregate", a_units), ("aggregate", a_orders_count),
        ("group_by", g_category_count), ("group_by", g_status_year), ("group_by", g_city_country),
        ("group_by", g_supplier_avg),
        ("having", h_cities), ("having", h_customers), ("having", h_categories), ("having", h_reviews),
        ("order_limit", o_top_category), ("order_limit", o_cheapest_country), ("order_limit", o_alphabetical),
        ("order_limit", o_below), ("order_limit", o_recent),
        ("nested", n_above_average), ("nested", n_never_status), ("nested", n_not_reviewed),
        ("nested", n_above_every), ("nested", n_top_product_orders),
        ("set_operation", s_countries), ("set_operation", s_union), ("set_operation", s_intersect),
        ("set_operation", s_except),
    ]  # fmt: skip


def has_answer(rows: list[tuple]) -> bool:
    """A usable reference result: at least one row, and not only NULLs or zero counts."""
    return bool(rows) and any(value not in (None, 0) for row in rows for value in row)


def make_pairs(db_path: Path, rng: random.Random) -> tuple[list[dict], list[dict]]:
    """(train, test) question/SQL pairs, each family split TEST_EVERY-fold."""
    train, test = [], []
    conn = sqlite3.connect(db_path)
    try:
        for skill, family in families(conn, rng):
            kept: list[tuple[str, str]] = []
            seen: set[str] = set()
            for question, query in family():
                if len(kept) == PER_TEMPLATE:
                    break
                if query in seen or not has_answer(_q(conn, query)):
                    continue
                seen.add(query)
                kept.append((question, query))
            for i, (question, query) in enumerate(kept):
                pair = {"skill": skill, "question": question, "query": query}
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


def build(out_dir: Path = HERE, seed: int = SEED) -> dict[str, Path]:
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
        "--out", type=Path, default=HERE, help="output folder (default: next to this script)"
    )
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    paths = build(args.out, args.seed)
    for name, path in paths.items():
        print(f"{name}: {path} ({path.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
