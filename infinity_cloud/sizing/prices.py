"""Refresh the AWS prices of the price table (`infinity_cloud/data/offers.json`) from AWS's Price
List API: SageMaker real-time inference (`platoinstancetype` Hosting) for the SageMaker instance
offers, EC2 Linux on-demand for the nodes of the Kubernetes offers, and Lambda's x86 price per
GB-second and per request for the Lambda offers. A maintainer runs it, with any AWS credentials
(the API is free); `plan` itself never fetches a price.

    python -m infinity_cloud.sizing.prices --refresh [--region us-east-1]

Modal's prices and SageMaker serverless's have no such refresh here: edit them by hand from
their pages, with the date."""

from __future__ import annotations

import argparse
import datetime
import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

# The services whose prices the API gives, and how an offer's product is found there.
_SERVICES = {
    "sagemaker": (
        "AmazonSageMaker",
        "instanceName",
        {"platoinstancetype": "Hosting", "productFamily": "ML Instance"},
    ),
    "kubernetes": (
        "AmazonEC2",
        "instanceType",
        {
            "operatingSystem": "Linux",
            "tenancy": "Shared",
            "preInstalledSw": "NA",
            "capacitystatus": "Used",
        },
    ),
}


def table_path() -> Path:
    return Path(str(resources.files("infinity_cloud").joinpath("data/offers.json")))


def on_demand_usd(price_list: list[str], unit: str = "hr") -> float | None:
    """The on-demand price per `unit` (a prefix of the API's unit, lower case: "hr" hourly,
    "lambda-gb-second", "request") in a get_products answer (its items are JSON strings); the
    first tier where the price is tiered."""
    for item in price_list:
        for term in json.loads(item).get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = float(dimension.get("pricePerUnit", {}).get("USD", 0) or 0)
                first_tier = dimension.get("beginRange", "0") in ("0", "0.0", "")
                if usd > 0 and first_tier and dimension.get("unit", "Hrs").lower().startswith(unit):
                    return usd
    return None


# Lambda's x86 prices: (the offer's field, the product group, the unit, the factor to the field).
_LAMBDA = (
    ("usd_per_gb_s", "AWS-Lambda-Duration", "lambda-gb-second", 1.0),
    ("usd_per_million_requests", "AWS-Lambda-Requests", "request", 1e6),
)


def _lambda_prices(client: Any, region: str) -> dict[str, float]:
    found = {}
    for key, group, unit, factor in _LAMBDA:
        filters = [
            {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
            {"Type": "TERM_MATCH", "Field": "group", "Value": group},
        ]
        answer = client.get_products(
            ServiceCode="AWSLambda", Filters=filters, FormatVersion="aws_v1", MaxResults=100
        )
        usd = on_demand_usd(answer.get("PriceList", []), unit)
        if usd is not None:
            found[key] = round(usd * factor, 10)
    return found


def _filters(field: str, name: str, region: str, fixed: dict[str, str]) -> list[dict[str, str]]:
    given = {field: name, "regionCode": region, **fixed}
    return [{"Type": "TERM_MATCH", "Field": key, "Value": value} for key, value in given.items()]


def fetched(client: Any, offers: list[dict[str, Any]], region: str) -> Iterator[tuple[dict[str, Any], float]]:
    """Each AWS offer with the price the API now gives for it (those it gives none for are left)."""
    for offer in offers:
        if offer["target"] not in _SERVICES or offer.get("billing", "hourly") != "hourly":
            continue
        service, field, fixed = _SERVICES[offer["target"]]
        answer = client.get_products(
            ServiceCode=service,
            Filters=_filters(field, offer["name"], region, fixed),
            FormatVersion="aws_v1",
            MaxResults=100,
        )
        usd = on_demand_usd(answer.get("PriceList", []))
        if usd is not None:
            yield offer, usd


def refresh(
    client: Any, path: Path, region: str = "us-east-1", today: datetime.date | None = None
) -> list[str]:
    """Rewrite `path`'s AWS prices from the API; the lines it changed."""
    table = json.loads(path.read_text(encoding="utf-8"))
    day = (today or datetime.date.today()).isoformat()
    changed = []
    for offer, usd in fetched(client, table["offers"], region):
        if usd != offer["usd_per_hour"]:
            changed.append(f"{offer['target']} {offer['name']}: ${offer['usd_per_hour']}/h -> ${usd}/h")
        offer.update(
            usd_per_hour=usd,
            as_of=day,
            source=f"AWS Price List API ({_SERVICES[offer['target']][0]}, {region}, on-demand)",
        )
    lambdas = [o for o in table["offers"] if o["target"] == "aws_lambda"]
    found = _lambda_prices(client, region) if lambdas else {}
    for offer in lambdas:
        for key, usd in found.items():
            if usd != offer.get(key):
                changed.append(f"aws_lambda {offer['name']} {key}: {offer.get(key)} -> {usd}")
            offer[key] = usd
        if found:
            gb_s = offer.get("usd_per_gb_s") or 0
            offer.update(
                usd_per_hour=round(gb_s * offer["memory_gib"] * 3600, 4),
                as_of=day,
                source=f"AWS Price List API (AWSLambda, {region}, x86, first tier)",
            )
    path.write_text(_dumped(table), encoding="utf-8")
    return changed


def _dumped(table: dict[str, Any]) -> str:
    """The table as it is kept: one offer a line, so a refresh's diff is one line an offer."""
    rows = ",\n".join(f"    {json.dumps(offer)}" for offer in table["offers"])
    return f'{{\n  "about": {json.dumps(table["about"])},\n  "offers": [\n{rows}\n  ]\n}}\n'


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--refresh", action="store_true", required=True)
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument(
        "--table", type=Path, default=None, help="the table to rewrite (default: the package's)"
    )
    args = parser.parse_args()
    import boto3

    client = boto3.client("pricing", region_name="us-east-1")  # the API answers in us-east-1
    for line in refresh(client, args.table or table_path(), args.region) or ["no price changed"]:
        print(line)


if __name__ == "__main__":
    main()
