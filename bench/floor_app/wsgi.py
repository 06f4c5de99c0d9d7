import os

from django.core.wsgi import get_wsgi_application

os.environ["DJANGO_SETTINGS_MODULE"] = "floor_app.settings"
application = get_wsgi_application()
