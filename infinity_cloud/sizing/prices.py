"""Refresh the AWS prices of the price table (`infinity_cloud/data/offers.json`) from AWS's Price
List API: SageMaker real-time inference (`platoinstancetype` Hosting) for the SageMaker offers,
EC2 Linux on-demand for the nodes of the Kubernetes offers. A maintainer runs it, with any AWS
credentials (the API is free); `plan` itself never fetches a price.

    python -m infinity_cloud.sizing.prices --refresh [--region us-east-1]

Modal's and Lambda's prices have no such API here: edit them by hand from their pages, with
the date."""

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


def on_demand_usd(price_list: list[str]) -> float | None:
    """The hourly on-demand price in a get_products answer (its items are JSON strings)."""
    for item in price_list:
        for term in json.loads(item).get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = float(dimension.get("pricePerUnit", {}).get("USD", 0) or 0)
                if usd > 0 and dimension.get("unit", "Hrs").lower().startswith("hr"):
                    return usd
    return None


def _filters(field: str, name: str, region: str, fixed: dict[str, str]) -> list[dict[str, str]]:
    given = {field: name, "regionCode": region, **fixed}
    return [{"Type": "TERM_MATCH", "Field": key, "Value": value} for key, value in given.items()]


def fetched(client: Any, offers: list[dict[str, Any]], region: str) -> Iterator[tuple[dict[str, Any], float]]:
    """Each AWS offer with the price the API now gives for it (those it gives none for are left)."""
    for offer in offers:
        if offer["target"] not in _SERVICES:
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
    path.write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    return changed


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
