"""The HTTP app: one factory (`create_app`) that every target serves."""

from infinity_cloud.server.app import create_app

__all__ = ["create_app"]
