"""Template filters of the console: `{% load console %}` then `{{ item.received_at|when }}`."""

from django import template

from .. import times

register = template.Library()


@register.filter
def when(value):
    """ "2026-12-01 08:51 UTC (3 hours ago)"."""
    return times.when(value)


@register.filter
def absolute_time(value):
    """ "2026-12-01 08:51 UTC"."""
    return times.absolute(value)


@register.filter
def relative_time(value):
    """ "3 hours ago" / "in 20 minutes"."""
    return times.relative(value)
