from django.contrib import admin
from django.urls import path
from storefront import views

urlpatterns = [path("orders", views.place_order), path("admin/", admin.site.urls)]
